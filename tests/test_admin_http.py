"""The admin app over plain HTTP: authentication, security headers, keyset pages, overview."""

from __future__ import annotations

import re
from datetime import timedelta

import asyncpg
import httpx

from sidelinja_worker.admin import store as admin_store
from sidelinja_worker.queue import store
from tests.admin_fixtures import admin_fixture, seed, token_for  # noqa: F401 (fixture)
from tests.helpers import cli


async def pages(http: httpx.AsyncClient, url: str | None) -> list[str]:
    """The job ids of a list and every page after it, following the "Older" links (at most 20
    pages: a cursor that goes back would otherwise loop for long)."""
    seen: list[str] = []
    for _ in range(20):
        if url is None:
            return seen
        page = (await http.get(url)).text
        seen += re.findall(r'<tr data-job="([0-9a-f-]{36})"', page)
        more = re.search(r'href="(/admin/jobs\?[^"]+)" id="next"', page)
        url = more[1].replace("&amp;", "&") if more else None
    raise AssertionError(f"still more pages after 20: {url}")


async def test_no_token_or_a_revoked_one_gets_nothing(
    pool: asyncpg.Pool, db_url: str, admin: str
) -> None:
    a, _b, _ = await seed(pool)
    token = token_for(db_url, "--workspace", str(a))
    async with httpx.AsyncClient(base_url=admin) as http:
        assert (await http.get("/admin/jobs")).headers["location"] == "/admin/login"
        assert (await http.get("/metrics")).status_code == 401
        ok = await http.get("/admin/jobs", headers={"authorization": f"Bearer {token}"})
        assert ok.status_code == 200 and ok.headers["x-frame-options"] == "DENY"
        assert "frame-ancestors 'none'" in ok.headers["content-security-policy"]
        listed = cli("admin-token", "list", url=db_url).stdout.split()
        assert cli("admin-token", "revoke", listed[0], url=db_url).returncode == 0
        gone = await http.get("/admin/jobs", headers={"authorization": f"Bearer {token}"})
        assert gone.status_code == 303


async def test_keyset_pages_cover_every_job_once(
    pool: asyncpg.Pool, db_url: str, admin: str
) -> None:
    a, _b, _ = await seed(pool)
    # 120 more failed jobs, many sharing one created_at: the id breaks the ties.
    await pool.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload, status, created_at)"
        " SELECT $1, 'noop', '{}', 'error', now() - (g / 7) * interval '1 s'"
        " FROM generate_series(1, 120) g",
        a,
    )
    headers = {"authorization": f"Bearer {token_for(db_url, '--workspace', str(a))}"}
    async with httpx.AsyncClient(base_url=admin, headers=headers) as http:
        seen = await pages(http, "/admin/jobs?status=error")
    assert len(seen) == len(set(seen)) == 125


async def test_all_statuses_page_through_every_status_once_in_order(
    pool: asyncpg.Pool, db_url: str, admin: str
) -> None:
    a, _b, _ = await seed(pool)
    # 25 jobs of every status, their times tied in sevens, so pages end inside a status, on a
    # tie, and on the boundary between two statuses. Completed jobs sort by when they finished,
    # here the reverse of when they were created.
    await pool.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload, status, created_at, completed_at)"
        " SELECT $1, 'noop', '{}', s::job_status, now() - (g / 7) * interval '1 s',"
        "        CASE WHEN s IN ('completed', 'error', 'cancelled')"
        "             THEN now() - (25 - g) / 7 * interval '1 s' END"
        " FROM unnest($2::text[]) s, generate_series(1, 25) g",
        a,
        list(admin_store.STATUS_ORDER),
    )
    expected = [
        str(r[0])
        for r in await pool.fetch(
            "SELECT id FROM job_queue WHERE workspace_id = $1"
            " ORDER BY array_position($2::text[], status::text),"
            "          CASE WHEN status = 'completed' THEN completed_at ELSE created_at END DESC,"
            "          id DESC",
            a,
            list(admin_store.STATUS_ORDER),
        )
    ]
    headers = {"authorization": f"Bearer {token_for(db_url, '--workspace', str(a))}"}
    async with httpx.AsyncClient(base_url=admin, headers=headers) as http:
        seen = await pages(http, "/admin/jobs?status=all")
    assert len(expected) == 156 and seen == expected


async def test_from_and_to_are_finish_times_for_completed_jobs(
    pool: asyncpg.Pool, db_url: str, admin: str
) -> None:
    a, _b, _ = await seed(pool)
    sql = (
        "INSERT INTO job_queue (workspace_id, job_type, payload, status, created_at,"
        " completed_at) VALUES ($1, 'noop', '{}', $2::job_status, now() - $3::text::interval,"
        " now() - $4::text::interval) RETURNING id::text"
    )
    old_finished_late = await pool.fetchval(sql, a, "completed", "3 days", "1 hour")
    await pool.fetchval(sql, a, "completed", "1 hour", "1 minute")
    old_error = await pool.fetchval(sql, a, "error", "3 days", "1 hour")
    now = await pool.fetchval("SELECT now()")
    window = (
        f"from={(now - timedelta(hours=2)).isoformat()}"
        f"&to={(now - timedelta(minutes=30)).isoformat()}"
    ).replace("+", "%2B")
    headers = {"authorization": f"Bearer {token_for(db_url, '--workspace', str(a))}"}
    async with httpx.AsyncClient(base_url=admin, headers=headers) as http:
        assert await pages(http, f"/admin/jobs?status=completed&{window}") == [old_finished_late]
        assert await pages(http, f"/admin/jobs?status=all&{window}") == [old_finished_late]
        assert old_error not in await pages(http, f"/admin/jobs?status=error&{window}")


async def test_overview_counts_only_the_token_s_workspace(
    pool: asyncpg.Pool, db_url: str, admin: str
) -> None:
    a, b, _ = await seed(pool)
    await store.set_type_limit(pool, "whisper_transcribe", 1)
    await store.set_workspace_limit(pool, b, 7)
    headers = {"authorization": f"Bearer {token_for(db_url, '--workspace', str(a))}"}
    async with httpx.AsyncClient(base_url=admin, headers=headers) as http:
        page = (await http.get("/admin")).text
        metrics = (await http.get("/metrics")).text
    assert "Queue overview" in page and "srt_parse" in page
    # The limits are shown, but not another workspace's cap.
    assert "whisper_transcribe" in page and "fair_workspaces" in page and str(b) not in page
    assert 'sidelinja_jobs{job_type="noop",status="error"} 3.0' in metrics  # B's one is not here
    assert 'sidelinja_jobs_finished_last_hour{status="completed"} 1.0' in metrics
