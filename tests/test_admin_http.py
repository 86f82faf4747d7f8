"""The admin app over plain HTTP: authentication, security headers, keyset pages, overview."""

from __future__ import annotations

import re

import asyncpg
import httpx

from sidelinja_worker import store
from tests.admin_fixtures import admin_fixture, seed, token_for  # noqa: F401 (fixture)
from tests.helpers import cli


async def test_no_token_or_a_revoked_one_gets_nothing(pool: asyncpg.Pool, db_url: str,
                                                       admin: str) -> None:
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


async def test_keyset_pages_cover_every_job_once(pool: asyncpg.Pool, db_url: str,
                                                 admin: str) -> None:
    a, _b, _ = await seed(pool)
    # 120 more failed jobs, many sharing one created_at: the id breaks the ties.
    await pool.execute("INSERT INTO job_queue (workspace_id, job_type, payload, status, created_at)"
                       " SELECT $1, 'noop', '{}', 'error', now() - (g / 7) * interval '1 s'"
                       " FROM generate_series(1, 120) g", a)
    headers = {"authorization": f"Bearer {token_for(db_url, '--workspace', str(a))}"}
    seen: list[str] = []
    url: str | None = "/admin/jobs?status=error"
    async with httpx.AsyncClient(base_url=admin, headers=headers) as http:
        while url:
            page = (await http.get(url)).text
            seen += re.findall(r'<tr data-job="([0-9a-f-]{36})"', page)
            more = re.search(r'href="(/admin/jobs\?[^"]+)" id="next"', page)
            url = more[1].replace("&amp;", "&") if more else None
    assert len(seen) == len(set(seen)) == 125


async def test_overview_counts_only_the_token_s_workspace(pool: asyncpg.Pool, db_url: str,
                                                           admin: str) -> None:
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
