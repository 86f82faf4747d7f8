"""The admin view in real headless Chromium (Debian's, driven by Playwright) against the running
`sidelinja-worker admin` and a real database."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from uuid import UUID

import asyncpg
import pytest

from sidelinja_worker.queue import store
from tests.admin_fixtures import admin_fixture, seed, token_for  # noqa: F401 (fixture)
from tests.helpers import insert_jobs, run_burst

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists(),
    reason=f"{CHROMIUM} is missing: apt-get install -y chromium (Debian's; never a download)",
)
playwright_api = pytest.importorskip("playwright.async_api")


@pytest.fixture
async def browser() -> AsyncIterator[object]:
    async with playwright_api.async_playwright() as p:
        b = await p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        await b.close()


async def logged_in(browser: object, base: str, token: str) -> object:
    # bypass_csp: Playwright's wait_for_function evaluates its predicate with eval, which the
    # pages' script-src 'self' refuses; the pages' own script still runs as served.
    page = await browser.new_page(bypass_csp=True)  # type: ignore[attr-defined]
    await page.goto(f"{base}/admin/login")
    await page.fill("#token", token)
    await page.click("button[type=submit]")
    await page.wait_for_url("**/admin/jobs")
    return page


async def row_ids(page: object) -> set[str]:
    return set(
        await page.locator("tr[data-job]").evaluate_all(  # type: ignore[attr-defined]
            "rows => rows.map(r => r.dataset.job)"
        )
    )


async def test_filter_open_retry_and_watch_it_live(
    pool: asyncpg.Pool, db_url: str, admin: str, browser: object
) -> None:
    a, _b, b_job = await seed(pool)
    page = await logged_in(browser, admin, token_for(db_url, "--workspace", str(a)))
    assert len(await row_ids(page)) == 5 and str(b_job) not in await row_ids(page)

    await page.fill("#f-type", "noop")
    await page.click("#apply")
    await page.wait_for_url("**type=noop**")
    assert len(await row_ids(page)) == 3
    await shot(page, "admin-jobs.png")

    await page.locator("tr[data-job] a").first.click()
    await page.wait_for_selector("#job-status")
    job_id = UUID(page.url.rsplit("/", 1)[-1])
    assert "episode" in await page.inner_text("#payload")
    assert "HTTP 503 from whisper" in await page.inner_text("#errors")
    assert await page.inner_text("#job-status") == "error"

    page.once("dialog", lambda d: asyncio.ensure_future(d.accept()))
    await page.click("#retry")
    await page.wait_for_url("**done=retry")
    assert await page.inner_text("#job-status") == "pending"
    assert (
        await pool.fetchval("SELECT action FROM admin_audit WHERE $1 = ANY(job_ids)", job_id)
        == "retry"
    )

    await page.wait_for_selector("body[data-live=on]")
    await page.evaluate("window.notReloaded = true")
    worker_id = await claim_by_hand(pool, job_id)
    await store.report_progress(pool, job_id, worker_id, "Transkriberer…", 40)
    await page.wait_for_function("document.querySelector('#job-status').textContent === 'running'")
    await page.wait_for_function(
        "document.querySelector('#job-progress').textContent.includes('Transkriberer… (40 %)')"
    )
    await shot(page, "admin-job.png")
    await pool.execute(
        "UPDATE job_queue SET status = 'pending', worker_id = NULL WHERE id = $1", job_id
    )
    await run_burst(pool, db_url)
    await page.wait_for_function(
        "document.querySelector('#job-status').textContent === 'completed'"
    )
    assert await page.evaluate("window.notReloaded") is True


async def test_the_job_page_s_buttons_follow_its_live_status(
    pool: asyncpg.Pool, db_url: str, admin: str, browser: object
) -> None:
    """The job page drew Cancel and Retry for the status it was rendered with and kept them
    while its status changed live: a job that failed under the operator's eyes offered Cancel
    (which then did nothing) and no Retry. Its buttons now follow each status it receives."""
    a, _b, _ = await seed(pool)
    job_id = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload) VALUES ($1, 'noop', '{}')"
        " RETURNING id",
        a,
    )
    page = await logged_in(browser, admin, token_for(db_url, "--workspace", str(a)))
    await page.goto(f"{admin}/admin/jobs/{job_id}")
    await page.wait_for_selector("body[data-live=on]")
    assert await page.is_visible("#cancel") and not await page.is_visible("#retry")

    async def becomes(status: str, cancel: bool, retry: bool) -> None:
        await page.wait_for_function(
            f"document.querySelector('#job-status').textContent === '{status}'"
        )
        for button, shown in (("#cancel", cancel), ("#retry", retry)):
            await page.wait_for_selector(
                button, state="visible" if shown else "hidden", timeout=5_000
            )

    await pool.execute(
        "UPDATE job_queue SET status = 'error', completed_at = now() WHERE id = $1", job_id
    )
    await becomes("error", cancel=False, retry=True)
    page.once("dialog", lambda d: asyncio.ensure_future(d.accept()))
    await page.click("#retry")
    await page.wait_for_url("**done=retry")
    await becomes("pending", cancel=True, retry=False)
    await pool.execute("UPDATE job_queue SET status = 'retry' WHERE id = $1", job_id)
    await becomes("retry", cancel=True, retry=True)
    await pool.execute(
        "UPDATE job_queue SET status = 'completed', completed_at = now() WHERE id = $1", job_id
    )
    await becomes("completed", cancel=False, retry=False)


async def claim_by_hand(pool: asyncpg.Pool, job_id: UUID) -> UUID:
    """What a worker's claim does to the row, so a progress report is accepted."""
    worker_id = await pool.fetchval("SELECT gen_random_uuid()")
    await pool.execute(
        "UPDATE job_queue SET status = 'running', worker_id = $2,"
        " attempts = attempts + 1 WHERE id = $1",
        job_id,
        worker_id,
    )
    return worker_id


async def shot(page: object, name: str) -> None:
    folder = os.environ.get("SIDELINJA_SCREENSHOT_DIR")
    if folder:
        await page.set_viewport_size({"width": 1200, "height": 760})  # type: ignore[attr-defined]
        await page.screenshot(path=str(Path(folder) / name), full_page=True)  # type: ignore[attr-defined]


async def test_a_workspace_token_never_sees_another_workspace(
    pool: asyncpg.Pool, db_url: str, admin: str, browser: object
) -> None:
    a, b, b_job = await seed(pool)
    page = await logged_in(browser, admin, token_for(db_url, "--workspace", str(a)))
    for query in ("status=all", f"status=all&workspace={b}", f"status=error&workspace={b}"):
        await page.goto(f"{admin}/admin/jobs?{query}")
        assert str(b_job) not in await row_ids(page) and len(await row_ids(page)) > 0

    await page.goto(f"{admin}/admin/jobs/{b_job}")
    assert await page.is_visible("#missing")
    assert "B-only" not in await page.content()

    await page.goto(f"{admin}/admin/jobs?status=error")
    await page.wait_for_selector("body[data-live=on]")
    await page.evaluate("""() => { window.seen = [];
        const s = new EventSource('/admin/events');
        s.onmessage = m => window.seen.push(JSON.parse(m.data));
        return new Promise(r => { s.onopen = r; }); }""")
    a_job = await pool.fetchval("SELECT id FROM job_queue WHERE workspace_id = $1 LIMIT 1", a)
    await pool.execute("UPDATE job_queue SET status = 'retry' WHERE id = $1", b_job)
    await pool.execute("UPDATE job_queue SET status = 'error', priority = 1 WHERE id = $1", a_job)
    await pool.execute("UPDATE job_queue SET status = 'retry' WHERE id = $1", a_job)
    await page.wait_for_function(f"window.seen.some(e => e.id === '{a_job}')")
    seen = await page.evaluate("window.seen")
    assert {e["workspace_id"] for e in seen} == {str(a)}

    csrf = await page.get_attribute("form.bulk input[name=csrf]", "value")
    forged = await page.request.post(
        f"{admin}/admin/jobs/bulk-retry", form={"status": "all", "workspace": str(b), "csrf": csrf}
    )
    assert forged.ok
    no_csrf = await page.request.post(f"{admin}/admin/jobs/bulk-retry", form={"status": "all"})
    assert no_csrf.status == 403
    page.once("dialog", lambda d: asyncio.ensure_future(d.accept()))
    await page.click("#bulk-retry")
    await page.wait_for_selector("#retried")
    assert await pool.fetchval("SELECT status::text FROM job_queue WHERE id = $1", b_job) == "retry"
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM job_queue WHERE workspace_id = $1"
            " AND status IN ('error', 'retry')",
            a,
        )
        == 0
    )


async def test_pause_resume_and_the_workers_page_in_the_browser(
    pool: asyncpg.Pool, db_url: str, admin: str, browser: object
) -> None:
    """A platform admin pauses a type from the overview, sees a worker and the job it runs,
    drains it and resumes the type; a workspace token sees the workers but no drain button and
    not the other workspace's job."""
    a, b, _ = await seed(pool)
    await pool.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload) VALUES ($1, 'noop', '{}')", a
    )
    job_id = await pool.fetchval("SELECT id FROM job_queue WHERE status = 'pending'")
    worker_id = await pool.fetchval("SELECT gen_random_uuid()")
    await store.register_worker(pool, worker_id, "render-1", 4242, ["noop"], 600, "0.1.0", 8)
    await pool.execute(
        "UPDATE job_queue SET status = 'running', worker_id = $2, started_at = now(),"
        " attempts = 1 WHERE id = $1",
        job_id,
        worker_id,
    )
    page = await logged_in(browser, admin, token_for(db_url, "--all"))
    await page.goto(f"{admin}/admin")
    await page.fill("#pause-form input[name=job_type]", "srt_parse")
    await page.fill("#pause-form input[name=reason]", "parser bug")
    await page.click("#pause-form button")
    await page.wait_for_selector("#done")
    assert "parser bug" in await page.inner_text("#pauses")
    await page.goto(f"{admin}/admin/workers")
    row = page.locator(f"tr[data-worker='{worker_id}']")
    assert "render-1" in await row.inner_text() and str(job_id)[:8] in await row.inner_text()
    await shot(page, "admin-workers.png")
    await row.locator("button").click()
    await page.wait_for_selector(f"tr[data-worker='{worker_id}'] >> text=draining")
    assert await pool.fetchval(
        "SELECT drain_requested_at IS NOT NULL FROM job_workers WHERE id = $1", worker_id
    )
    await page.goto(f"{admin}/admin")
    await page.fill("#pauses input[name=reason]", "fixed")
    await page.click("#pauses button")
    await page.wait_for_selector("#done")
    assert await pool.fetchval("SELECT count(*) FROM job_type_pauses") == 0

    confined = await logged_in(browser, admin, token_for(db_url, "--workspace", str(b)))
    await confined.goto(f"{admin}/admin/workers")
    text = await confined.inner_text("#workers")
    assert "render-1" in text and str(job_id)[:8] not in text
    assert await confined.locator("#workers button").count() == 0


async def test_the_dashboard_live_for_two_workspaces(
    pool: asyncpg.Pool, db_url: str, admin: str, browser: object
) -> None:
    """A platform admin's dashboard counts both workspaces and updates by itself when more jobs
    end; a workspace token's counts its own only."""
    from tests.test_dashboard import REGISTRY, _two_workspaces

    a, b = await _two_workspaces(pool, db_url)
    page = await logged_in(browser, admin, token_for(db_url, "--all"))
    await page.goto(f"{admin}/admin/dashboard")
    assert await page.inner_text("#completed-hour") == "8"
    assert await page.locator("svg.chart").count() >= 4  # two queue-wide, one per type
    await insert_jobs(pool, b, 3, job_type_name="ok")
    await run_burst(pool, db_url, REGISTRY)
    await page.wait_for_function(
        "document.getElementById('completed-hour').textContent === '11'", timeout=20_000
    )
    await shot(page, "admin-dashboard.png")
    confined = await logged_in(browser, admin, token_for(db_url, "--workspace", str(a)))
    await confined.goto(f"{admin}/admin/dashboard")
    assert await confined.inner_text("#completed-hour") == "5"
    assert await confined.inner_text("#failed-hour") == "2"


async def test_the_dashboard_says_when_it_stops_refreshing(
    pool: asyncpg.Pool, db_url: str, admin: str, browser: object
) -> None:
    """The dashboard fetches its body every 5 s and showed nothing when a fetch failed: once
    its session ended (its token revoked, or 8 hours past login) its figures stopped changing
    for good and the page looked as live as ever. It now says since when it is not refreshed
    and why, and says nothing once a refresh succeeds again."""
    a, _b, _ = await seed(pool)
    page = await logged_in(browser, admin, token_for(db_url, "--workspace", str(a)))
    await page.goto(f"{admin}/admin/dashboard")
    await page.wait_for_selector("body[data-refreshed='1']", timeout=20_000)
    assert await page.is_hidden("#dashboard-stale")
    await pool.execute("UPDATE admin_tokens SET revoked_at = now()")
    await page.wait_for_selector("#dashboard-stale:not([hidden])", timeout=20_000)
    assert "the session has ended" in await page.inner_text("#dashboard-stale")
    await pool.execute("UPDATE admin_tokens SET revoked_at = NULL")  # the session holds again
    await page.wait_for_selector("#dashboard-stale", state="hidden", timeout=20_000)


async def test_a_page_whose_stream_is_refused_says_it_is_no_longer_live(
    pool: asyncpg.Pool, db_url: str, admin: str, browser: object
) -> None:
    """Once a page's session ended, its stream ended and the browser's reconnect was refused
    (401), which closes an EventSource for good; the page said "live: reconnecting" for as long
    as it stayed open. It now says the page is no longer live and is to be reloaded."""
    a, _b, _ = await seed(pool)
    page = await logged_in(browser, admin, token_for(db_url, "--workspace", str(a)))
    await page.wait_for_selector("body[data-live=on]")
    await pool.execute("UPDATE admin_tokens SET revoked_at = now()")
    await page.wait_for_selector("body[data-live=closed]", timeout=20_000)
    assert await page.inner_text("#live") == "live: off, reload the page"
