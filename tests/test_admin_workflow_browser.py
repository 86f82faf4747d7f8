"""The admin view's workflow page in real headless Chromium: a graph with a failed node, its
retry, the graph coming back live, and another workspace's token kept out."""

from __future__ import annotations

import asyncio
from uuid import UUID

import asyncpg
import httpx

from tests.admin_fixtures import admin_fixture, seed, token_for  # noqa: F401 (fixture)
from tests.test_admin_browser import browser, logged_in, pytestmark, shot  # noqa: F401

# a fails; b and c (its children) and d (c's child) are cancelled by it; cleanup runs anyway.
GRAPH = """
WITH jobs AS (
    INSERT INTO job_queue (workspace_id, job_type, payload)
    SELECT $1, t, jsonb_build_object('name', n)
    FROM unnest(ARRAY['a', 'b', 'c', 'd', 'cleanup'],
                ARRAY['whisper_transcribe', 'srt_parse', 'openrouter_analyze', 'noop', 'noop'])
         AS x(n, t)
    RETURNING id, payload->>'name' AS name
)
INSERT INTO job_dependencies (parent_id, child_id, run_anyway)
SELECT p.id, c.id, e.anyway
FROM (VALUES ('a', 'b', false), ('a', 'c', false), ('c', 'd', false), ('a', 'cleanup', true))
     AS e(parent, child, anyway)
JOIN jobs p ON p.name = e.parent JOIN jobs c ON c.name = e.child
"""


async def names(pool: asyncpg.Pool) -> dict[str, tuple[UUID, str]]:
    rows = await pool.fetch(
        "SELECT payload->>'name' AS name, id, status::text AS status FROM job_queue"
        " WHERE payload ? 'name'"
    )
    return {r["name"]: (r["id"], r["status"]) for r in rows}


async def test_a_failed_node_is_retried_and_its_branch_comes_back_live(
    pool: asyncpg.Pool,
    db_url: str,
    admin: str,
    browser: object,  # noqa: F811
) -> None:
    a_ws, b_ws, _ = await seed(pool)
    await pool.execute(GRAPH, a_ws)
    jobs = await names(pool)
    await pool.execute(
        "UPDATE job_queue SET status = 'error', attempts = 3, error_msg = 'HTTP 503 from whisper',"
        " completed_at = now() WHERE id = $1",
        jobs["a"][0],
    )
    await pool.execute(
        "UPDATE job_queue SET status = 'completed', completed_at = now() WHERE id = $1",
        jobs["cleanup"][0],
    )
    jobs = await names(pool)
    assert [jobs[n][1] for n in ("a", "b", "c", "d")] == ["error"] + ["cancelled"] * 3
    a_id, d_id = jobs["a"][0], jobs["d"][0]

    page = await logged_in(browser, admin, token_for(db_url, "--workspace", str(a_ws)))
    # From the list to the graph: the failed parent's row links to it.
    await page.goto(f"{admin}/admin/jobs?status=error&type=whisper_transcribe")
    await page.click(f"tr[data-job='{a_id}'] a.graph-link")
    await page.wait_for_url(f"**/admin/jobs/{a_id}/graph")
    assert await page.locator("#graph [data-node]").count() == 5
    assert await page.locator("#graph line.edge").count() == 4
    assert await page.locator("#graph line.run-anyway").count() == 1
    status = "#graph [data-node='{}'] [data-node-status]"
    assert await page.text_content(status.format(a_id)) == "error"
    assert await page.text_content(status.format(d_id)) == "cancelled"
    assert await page.is_visible(f"tr[data-job='{d_id}'] form.node-retry")
    assert not await page.is_visible(f"tr[data-job='{jobs['cleanup'][0]}'] form.node-retry")
    await page.wait_for_selector("body[data-live=on]")
    await page.evaluate("window.notReloaded = true")
    await shot(page, "admin-workflow.png")

    # Retry from the grandchild d: it puts back a, the failed job that cancelled its branch.
    page.once("dialog", lambda d: asyncio.ensure_future(d.accept()))
    await page.click(f"tr[data-job='{d_id}'] form.node-retry button")
    await page.wait_for_function(
        f"document.querySelector(\"{status.format(a_id)}\").textContent === 'pending'"
    )
    for name in ("b", "c", "d"):
        node = status.format(jobs[name][0])
        await page.wait_for_function(
            f"document.querySelector(\"{node}\").textContent === 'waiting'"
        )
    assert await page.evaluate("window.notReloaded") is True
    assert (
        await page.get_attribute(f"#graph [data-node='{a_id}']", "class") == "node s-pending focus"
    )
    assert not await page.is_visible(f"tr[data-job='{d_id}'] form.node-retry")
    audit = await pool.fetchrow("SELECT action, job_ids, detail FROM admin_audit")
    assert (audit["action"], audit["job_ids"]) == ("retry", [a_id])
    assert audit["detail"] == {"asked_for": str(d_id)}
    # The graph moves on as its jobs run: a completes, its children are released, live.
    await pool.execute(
        "UPDATE job_queue SET status = 'completed', completed_at = now() WHERE id = $1", a_id
    )
    await page.wait_for_function(
        f"document.querySelector(\"{status.format(jobs['b'][0])}\").textContent === 'pending'"
    )
    assert await page.evaluate("window.notReloaded") is True

    # Another workspace's token: 404 for the page and for a retry, whatever the graph.
    other = token_for(db_url, "--workspace", str(b_ws))
    async with httpx.AsyncClient(
        base_url=admin, headers={"authorization": f"Bearer {other}"}
    ) as http:
        for job in (a_id, d_id):
            missing = await http.get(f"/admin/jobs/{job}/graph")
            assert missing.status_code == 404 and "srt_parse" not in missing.text
