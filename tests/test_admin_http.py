"""The admin app over plain HTTP: authentication, security headers, keyset pages, overview."""

from __future__ import annotations

import asyncio
import html
import re
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode
from uuid import UUID, uuid4

import asyncpg
import httpx
import orjson

from sidelinja_worker.admin import auth
from sidelinja_worker.admin import store as admin_store
from sidelinja_worker.queue import store
from tests.admin_fixtures import (  # noqa: F401 (fixture)
    admin_fixture,
    new_jobs,
    seed,
    token_for,
    workspace_bearer,
)
from tests.helpers import cli, make_workspace


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


def _link(page: str, name: str) -> str | None:
    """The href of the jobs page's paging link `name` (next, newer, newest), if it shows one."""
    found = re.search(rf'href="(/admin/jobs\?[^"]*)" id="{name}"', page)
    return html.unescape(found[1]) if found else None


def _ids(page: str) -> list[str]:
    return re.findall(r'<tr data-job="([0-9a-f-]{36})"', page)


async def test_the_job_list_pages_back_to_newer_jobs_and_the_newest(
    pool: asyncpg.Pool, db_url: str, admin: str
) -> None:
    """The list paged to older jobs only ("Older"): back was the browser's history, or the
    filter sent again. "Newer" shows the page before, across a change of status as "Older"
    does, and "Newest" the first page; both by a cursor, never an offset."""
    a = await make_workspace(pool, "Alfa")
    await pool.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload, status, created_at)"
        " SELECT $1, 'noop', '{}', CASE WHEN i <= 70 THEN 'error' ELSE 'pending' END::job_status,"
        " now() - i * interval '1 minute' FROM generate_series(1, 150) i",
        a,
    )
    headers = {"authorization": f"Bearer {token_for(db_url, '--all')}"}
    async with httpx.AsyncClient(base_url=admin, headers=headers) as http:
        first = (await http.get("/admin/jobs?status=all")).text
        assert _link(first, "newer") is None and _link(first, "newest") is None
        second = (await http.get(_link(first, "next") or "")).text
        third = (await http.get(_link(second, "next") or "")).text
        assert [len(_ids(p)) for p in (first, second, third)] == [50, 50, 50]
        assert _link(third, "next") is None
        back = (await http.get(_link(third, "newer") or "")).text
        assert _ids(back) == _ids(second)  # 20 errors, then 30 pending jobs
        assert _ids((await http.get(_link(back, "next") or "")).text) == _ids(third)
        top = (await http.get(_link(back, "newer") or "")).text
        assert _ids(top) == _ids(first) and _link(top, "newer") is None
        assert _ids((await http.get(_link(third, "newest") or "")).text) == _ids(first)
        one_status = (await http.get("/admin/jobs?status=pending")).text
        older = (await http.get(_link(one_status, "next") or "")).text
        assert len(_ids(older)) == 30
        assert _ids((await http.get(_link(older, "newer") or "")).text) == _ids(one_status)
    statements = (line.split("--")[0] for q in admin_store.Q.values() for line in q.splitlines())
    assert "OFFSET" not in " ".join(statements).upper()


async def test_no_token_or_a_revoked_one_gets_nothing(
    pool: asyncpg.Pool, db_url: str, admin: str
) -> None:
    a, _b, _ = await seed(pool)
    token = token_for(db_url, "--workspace", str(a))
    async with httpx.AsyncClient(base_url=admin) as http:
        page = await http.get("/admin/jobs", headers={"accept": "text/html"})
        assert page.headers["location"] == "/admin/login"
        assert (await http.get("/metrics")).status_code == 401
        ok = await http.get("/admin/jobs", headers={"authorization": f"Bearer {token}"})
        assert ok.status_code == 200 and ok.headers["x-frame-options"] == "DENY"
        assert "frame-ancestors 'none'" in ok.headers["content-security-policy"]
        listed = cli("admin-token", "list", url=db_url).stdout.split()
        assert cli("admin-token", "revoke", listed[0], url=db_url).returncode == 0
        gone = await http.get("/admin/jobs", headers={"authorization": f"Bearer {token}"})
        assert gone.status_code == 401


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
    headers = workspace_bearer(db_url, a)
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
    headers = workspace_bearer(db_url, a)
    async with httpx.AsyncClient(base_url=admin, headers=headers) as http:
        seen = await pages(http, "/admin/jobs?status=all")
    assert len(expected) == 25 * len(admin_store.STATUS_ORDER) + 6 and seen == expected
    assert "waiting" in admin_store.STATUS_ORDER


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
    headers = workspace_bearer(db_url, a)
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
    headers = workspace_bearer(db_url, a)
    async with httpx.AsyncClient(base_url=admin, headers=headers) as http:
        page = (await http.get("/admin")).text
        metrics = (await http.get("/metrics")).text
    assert "Queue overview" in page and "srt_parse" in page
    # The limits are shown, but not another workspace's cap.
    assert "whisper_transcribe" in page and "fair_workspaces" in page and str(b) not in page
    assert 'sidelinja_jobs{job_type="noop",status="error"} 3.0' in metrics  # B's one is not here
    assert 'sidelinja_jobs_finished_last_hour{status="completed"} 1.0' in metrics


async def test_a_workspace_cap_is_named_by_its_workspace_s_name(
    pool: asyncpg.Pool, db_url: str, admin: str
) -> None:
    """The limits table named a capped workspace by its id alone: it names it by its name,
    escaped, with the id (which `limits workspace` takes) beside it."""
    a, _b, _ = await seed(pool)
    marked = await make_workspace(pool, "Lyd <i>&</i> bilde")
    for ws, cap in ((a, 3), (marked, 4)):
        await pool.execute(
            "INSERT INTO workspace_limits (workspace_id, max_running) VALUES ($1, $2)", ws, cap
        )
    headers = {"authorization": f"Bearer {token_for(db_url, '--all')}"}
    async with httpx.AsyncClient(base_url=admin, headers=headers) as http:
        page = (await http.get("/admin")).text
    table = page.split('id="limits"', 1)[1].split("</table>", 1)[0]
    rows = {
        cells[2]: cells[1]
        for cells in (re.findall(r"<td[^>]*>(.*?)</td>", r, re.S) for r in table.split("<tr>"))
        if cells and cells[0] == "workspace"
    }
    assert set(rows) == {"3", "4"}, table
    assert html.unescape(re.sub(r"<[^>]*>", " ", rows["3"])).split() == ["Alfa", str(a)]
    assert "<i>" not in rows["4"] and "Lyd &lt;i&gt;&amp;&lt;/i&gt; bilde" in rows["4"]
    assert str(marked) in rows["4"]


BROWSER = {"accept": "text/html,application/xhtml+xml,*/*;q=0.8", "sec-fetch-mode": "navigate"}


async def test_api_clients_get_401_and_browsers_the_login_page(admin: str) -> None:
    async with httpx.AsyncClient(base_url=admin) as http:
        for path in ("/admin/jobs", "/admin", f"/admin/jobs/{uuid4()}"):
            page = await http.get(path, headers=BROWSER)
            assert page.status_code == 303, path
            assert page.headers["location"].startswith("/admin/login"), path
            old_browser = await http.get(path, headers={"accept": "text/html"})
            assert old_browser.status_code == 303, path
            for headers in (
                {"accept": "application/json"},
                {"accept": "*/*"},
                {"accept": "text/html", "authorization": "Bearer slj_wrong"},
                {"accept": "text/html", "sec-fetch-mode": "cors"},  # fetch() from a page
            ):
                answer = await http.get(path, headers=headers)
                assert answer.status_code == 401, (path, headers)
                assert answer.headers["www-authenticate"].startswith("Bearer"), (path, headers)
        as_json = await http.get("/admin/jobs", headers={"accept": "application/json"})
        assert as_json.json() == {"error": "a valid admin token is required"}
        assert (await http.get("/admin/events", headers=BROWSER)).status_code == 401


async def test_an_unknown_job_is_404(pool: asyncpg.Pool, db_url: str, admin: str) -> None:
    a, _b, b_job = await seed(pool)
    a_job = await pool.fetchval("SELECT id FROM job_queue WHERE workspace_id = $1 LIMIT 1", a)
    headers = workspace_bearer(db_url, a)
    async with httpx.AsyncClient(base_url=admin, headers=headers) as http:
        assert (await http.get(f"/admin/jobs/{a_job}")).status_code == 200
        for job_id in (uuid4(), b_job, "not-a-uuid"):  # another workspace's looks the same
            missing = await http.get(f"/admin/jobs/{job_id}")
            assert missing.status_code == 404 and "B failed" not in missing.text, job_id
            # Its title names it: it was "Jobs", the default, in the tab and the history.
            assert "<title>No such job · sidelinja-worker</title>" in missing.text, job_id


def session_cookie(response: httpx.Response) -> str:
    cookie = response.headers["set-cookie"]
    match = re.match(rf"{auth.COOKIE}=([^;]+);", cookie)
    assert match, cookie
    return match[1]


async def log_in(http: httpx.AsyncClient, token: str, **headers: str) -> httpx.Response:
    return await http.post("/admin/login", data={"token": token}, headers=headers)


async def test_a_session_is_its_own_secret_and_expires(
    pool: asyncpg.Pool, db_url: str, admin: str
) -> None:
    a, _b, _ = await seed(pool)
    token = token_for(db_url, "--workspace", str(a))
    async with httpx.AsyncClient(base_url=admin) as http:
        response = await log_in(http, token)
        assert response.status_code == 303
        secret = session_cookie(response)
        set_cookie = response.headers["set-cookie"].lower()
        assert secret != token and token not in response.headers["set-cookie"]
        assert f"max-age={auth.SESSION_LIFETIME_S}" in set_cookie
        assert all(flag in set_cookie for flag in ("httponly", "secure", "samesite=strict"))
        lifetime = await pool.fetchval("SELECT expires_at - created_at FROM admin_sessions")
        assert lifetime == timedelta(seconds=auth.SESSION_LIFETIME_S) == timedelta(hours=8)
        cookie = {"cookie": f"{auth.COOKIE}={secret}", **BROWSER}
        assert (await http.get("/admin/jobs", headers=cookie)).status_code == 200
        # The end of its lifetime, as the server keeps it (the browser's Max-Age aside).
        await pool.execute("UPDATE admin_sessions SET expires_at = now() - interval '1 s'")
        assert (await http.get("/admin/jobs", headers=cookie)).status_code == 303
        assert (await http.get("/metrics", headers=cookie)).status_code == 401
        # The next login prunes expired sessions.
        assert (await log_in(http, token)).status_code == 303
        assert await pool.fetchval("SELECT count(*) FROM admin_sessions") == 1


async def test_logout_ends_the_session_on_the_server(
    pool: asyncpg.Pool, db_url: str, admin: str
) -> None:
    a, _b, _ = await seed(pool)
    token = token_for(db_url, "--workspace", str(a))
    async with httpx.AsyncClient(base_url=admin) as http:
        secret = session_cookie(await log_in(http, token))
        cookie = {"cookie": f"{auth.COOKIE}={secret}"}
        page = (await http.get("/admin/jobs", headers=cookie)).text
        csrf = re.search(r'action="/admin/logout".*?name="csrf" value="([0-9a-f]+)"', page)
        assert csrf, "the logout form carries the CSRF value"
        out = await http.post("/admin/logout", data={"csrf": csrf[1]}, headers=cookie)
        assert out.status_code == 303 and out.headers["location"] == "/admin/login"
        assert await pool.fetchval("SELECT count(*) FROM admin_sessions") == 0
        assert (await http.get("/admin/jobs", headers={**cookie, **BROWSER})).status_code == 303


async def test_login_and_logout_refuse_cross_site_requests(
    pool: asyncpg.Pool, db_url: str, admin: str
) -> None:
    a, _b, _ = await seed(pool)
    token = token_for(db_url, "--workspace", str(a))
    evil = (
        {"origin": "https://evil.example"},
        {"origin": "null"},  # a sandboxed frame or a data: page
        {"sec-fetch-site": "cross-site"},
        {"sec-fetch-site": "same-site"},  # a sibling subdomain is another site's page too
    )
    async with httpx.AsyncClient(base_url=admin) as http:
        for headers in evil:
            refused = await log_in(http, token, **headers)
            assert refused.status_code == 403 and "set-cookie" not in refused.headers, headers
        assert await pool.fetchval("SELECT count(*) FROM admin_sessions") == 0
        ours = {"origin": admin, "sec-fetch-site": "same-origin"}
        secret = session_cookie(await log_in(http, token, **ours))
        cookie = {"cookie": f"{auth.COOKIE}={secret}"}
        csrf = auth.csrf_for(secret)
        for headers in evil:
            refused = await http.post(
                "/admin/logout", data={"csrf": csrf}, headers={**cookie, **headers}
            )
            assert refused.status_code == 403, headers
        no_csrf = await http.post("/admin/logout", headers={**cookie, **ours})
        assert no_csrf.status_code == 403
        assert await pool.fetchval("SELECT count(*) FROM admin_sessions") == 1
        done = await http.post("/admin/logout", data={"csrf": csrf}, headers={**cookie, **ours})
        assert done.status_code == 303
        assert await pool.fetchval("SELECT count(*) FROM admin_sessions") == 0


async def test_a_revoked_token_loses_its_stream_within_5s_on_a_busy_queue(
    pool: asyncpg.Pool, db_url: str, admin: str
) -> None:
    """Events keep coming (a producer inserts jobs all the while), so the stream is never idle;
    revoking the token (and with it the session it opened) still ends both streams."""
    a, _b, _ = await seed(pool)
    token = token_for(db_url, "--workspace", str(a))
    stop = asyncio.Event()

    async def produce() -> None:
        while not stop.is_set():
            await pool.execute(
                "INSERT INTO job_queue (workspace_id, job_type, payload)"
                " SELECT $1, 'noop', '{}' FROM generate_series(1, 5)",
                a,
            )
            await asyncio.sleep(0.02)

    async def watch(http: httpx.AsyncClient, headers: dict[str, str], frames: list[float]) -> float:
        """Reads the stream until it ends; the time it ended."""
        async with http.stream("GET", "/admin/events", headers=headers) as response:
            assert response.status_code == 200
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    frames.append(time.monotonic())
        return time.monotonic()

    async with httpx.AsyncClient(base_url=admin, timeout=30) as http:
        secret = session_cookie(await log_in(http, token))
        producer = asyncio.create_task(produce())
        bearer: list[float] = []
        session: list[float] = []
        watchers = [
            asyncio.create_task(watch(http, {"authorization": f"Bearer {token}"}, bearer)),
            asyncio.create_task(watch(http, {"cookie": f"{auth.COOKIE}={secret}"}, session)),
        ]
        try:
            async with asyncio.timeout(20):
                while len(bearer) < 20 or len(session) < 20:  # both streams are busy
                    await asyncio.sleep(0.05)
            await pool.execute("UPDATE admin_tokens SET revoked_at = now()")
            revoked_at = time.monotonic()
            async with asyncio.timeout(15):
                ended = await asyncio.gather(*watchers)
        finally:
            stop.set()
            await producer
            for w in watchers:
                w.cancel()
    assert all(t - revoked_at < 5 for t in ended), [t - revoked_at for t in ended]
    assert bearer[-1] > revoked_at - 1 and session[-1] > revoked_at - 1  # busy until the end


async def test_the_workflow_page_of_a_fan_out_of_1000_draws_300_jobs_and_says_so(
    pool: asyncpg.Pool, db_url: str, admin: str
) -> None:
    a, b, _ = await seed(pool)
    root = await pool.fetchval(
        "WITH p AS (INSERT INTO job_queue (workspace_id, job_type, payload)"
        "  VALUES ($1, 'noop', '{}') RETURNING id),"
        " c AS (INSERT INTO job_queue (workspace_id, job_type, payload)"
        "  SELECT $1, 'noop', '{}' FROM generate_series(1, 1000) RETURNING id),"
        " e AS (INSERT INTO job_dependencies (parent_id, child_id) SELECT p.id, c.id FROM p, c)"
        " SELECT id FROM p",
        a,
    )
    headers = workspace_bearer(db_url, a)
    async with httpx.AsyncClient(base_url=admin, headers=headers) as http:
        page = (await http.get(f"/admin/jobs/{root}/graph")).text
        child = await pool.fetchval("SELECT child_id FROM job_dependencies LIMIT 1")
        from_child = await http.get(f"/admin/jobs/{child}/graph")
    nodes = re.findall(r'data-node="([0-9a-f-]{36})"', page)
    assert len(nodes) == len(set(nodes)) == 300 and str(root) in nodes
    assert page.count('class="edge') == 299
    assert 'id="graph-cut"' in page and "only the\n  300 jobs nearest" in page
    # From a child, the walk reaches its parent first: the root is always drawn.
    assert from_child.status_code == 200 and f'data-node="{root}"' in from_child.text
    other = {"authorization": f"Bearer {token_for(db_url, '--workspace', str(b))}"}
    async with httpx.AsyncClient(base_url=admin, headers=other) as http:
        assert (await http.get(f"/admin/jobs/{root}/graph")).status_code == 404


async def test_a_job_page_names_a_giant_payload_result_or_history_instead_of_showing_it(
    pool: asyncpg.Pool, db_url: str, admin: str
) -> None:
    """Any plain-SQL writer of a row can make its payload, result or error history hundreds of
    megabytes; the job page shows each only up to admin_store.SHOW_MAX_BYTES as stored."""
    a, _b, _b_job = await seed(pool)
    giant = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload, status, result, errors,"
        "                       progress, error_msg)"
        " VALUES ($1, 'noop', jsonb_build_object('text',"
        "   (SELECT string_agg(md5(g::text), '') FROM generate_series(1, 40000) g)),"
        "  'completed', jsonb_build_object('text', repeat('r', 50000000)),"
        "  (SELECT jsonb_agg(jsonb_build_object('attempt', g, 'message', md5(g::text)))"
        "   FROM generate_series(1, 20000) g),"
        "  jsonb_build_object('message', repeat('p', 10000000), 'percent', 'ninety'),"
        "  repeat('e', 5000000))"
        " RETURNING id",
        a,
    )
    small = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload, progress) VALUES ($1, 'noop',"
        ' \'{"episode_id": 42}\', \'{"message": "Transkriberer", "percent": "ninety"}\')'
        " RETURNING id",
        a,
    )
    headers = workspace_bearer(db_url, a)
    async with httpx.AsyncClient(base_url=admin, headers=headers) as http:
        page = await http.get(f"/admin/jobs/{giant}")
        shown = await http.get(f"/admin/jobs/{small}")
    assert page.status_code == 200
    assert len(page.content) < 100_000, len(page.content)
    for what in ("payload", "result", "error history"):
        assert re.search(rf"The {what} is [\d,]+ bytes as stored: too big to show here", page.text)
    assert shown.status_code == 200 and "Transkriberer" in shown.text  # a percent not a number
    assert "too big" not in shown.text and '"episode_id": 42' in shown.text
    # Nor does a live stream send such a progress report to every page.
    async with pool.acquire() as conn:
        (event,) = await admin_store.jobs_for_events(conn, [giant])
    assert event["progress"] is None


async def test_keyset_pages_cover_jobs_created_at_infinity_once(
    pool: asyncpg.Pool, db_url: str, admin: str
) -> None:
    """created_at is the list's order and its cursor; a plain-SQL writer can set it to
    'infinity' or '-infinity', which no Python datetime holds. Both rows are listed once, and
    the pages before and after them still link on."""
    a, _b, _ = await seed(pool)
    await pool.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload, status, created_at)"
        " SELECT $1::uuid, 'noop', '{}'::jsonb, 'error'::job_status, t"
        " FROM unnest(ARRAY['infinity', '-infinity']::timestamptz[]) AS t"
        " UNION ALL"
        " SELECT $1, 'noop', '{}', 'error', now() - g * interval '1 s'"
        " FROM generate_series(1, 120) g",
        a,
    )
    headers = workspace_bearer(db_url, a)
    async with httpx.AsyncClient(base_url=admin, headers=headers) as http:
        seen = await pages(http, "/admin/jobs?status=error")
        everything = await pages(http, "/admin/jobs")
    assert len(seen) == len(set(seen)) == 127
    assert len(everything) == len(set(everything))
    assert set(seen) <= set(everything)


async def test_dates_no_datetime_holds_in_utc_are_the_end_of_time_they_pass(
    pool: asyncpg.Pool, db_url: str, admin: str
) -> None:
    """A From or To that reads as a date but leaves Python's years once moved to UTC (year 1
    east of UTC, year 9999 west of it) is the end of time it passed, a page cursor's is
    ignored, and a To within a day of year 1 beside a payload search (whose window starts a
    day before it) is a window too: the list answers. A bulk retry "To year 1" left the To out,
    and retried every failed job of the filter; it retries none."""
    a, _b, _ = await seed(pool)
    job = await pool.fetchval("SELECT id FROM job_queue WHERE workspace_id = $1 LIMIT 1", a)
    headers = workspace_bearer(db_url, a)
    async with httpx.AsyncClient(base_url=admin, headers=headers) as http:
        for query in (
            "status=all&from=0001-01-01T00:00:00%2B00:01",
            "status=all&to=9999-12-31T23:59:59-00:01",
            f"status=all&after_status=error&after_id={job}&after_at=0001-01-01T00:00%2B01:00",
        ):
            page = await http.get(f"/admin/jobs?{query}")
            assert page.status_code == 200, query
            assert len(re.findall(r'<tr data-job="', page.text)) == 6, query
        window = await http.get("/admin/jobs?status=all&to=0001-01-01T12:00&payload=episode%3D7")
        assert window.status_code == 200 and "No jobs match." in window.text
        early = await http.get("/admin/jobs?status=all&to=0001-01-01T00:00:00%2B05:00")
        assert early.status_code == 200 and "No jobs match." in early.text
        csrf = early.text.split('name="csrf" value="', 1)[1].split('"', 1)[0]
        form = {"csrf": csrf, "status": "all", "to": "0001-01-01T00:00:00+05:00"}
        same_site = {"sec-fetch-site": "same-origin"}
        sent = await http.post("/admin/jobs/bulk-retry", data=form, headers=same_site)
        assert sent.status_code == 303 and "retried=0" in sent.headers["location"], sent.headers
    assert await pool.fetchval("SELECT count(*) FROM job_queue WHERE status = 'pending'") == 0


async def test_a_from_or_to_that_is_no_time_is_a_400_saying_what_to_type(
    pool: asyncpg.Pool, db_url: str, admin: str
) -> None:
    """A From or To that was no time was left out of the filter without a word: the list
    answered for all time, as if the window held. It is a 400 naming the field and the format;
    ISO 8601 in its usual spellings is read (UTC when it names no zone)."""
    a, _b, _ = await seed(pool)
    headers = workspace_bearer(db_url, a)
    async with httpx.AsyncClient(base_url=admin, headers=headers) as http:
        for query, field in (
            ("from=yesterday", "from"),
            ("to=2026-13-01", "to"),
            ("from=12%2F7%2F2026+2%3A05+PM", "from"),
            ("to=" + "9" * 5000, "to"),
        ):
            page = await http.get(f"/admin/jobs?status=all&{query}")
            assert page.status_code == 400, (query, page.text)
            assert page.text.startswith(f"{field}: ") and "YYYY-MM-DDTHH:MM:SS" in page.text
            assert len(page.text) < 300, page.text
        for at in (
            "2026-12-07",
            "2026-12-07 14:05",
            "2026-12-07T14:05:00Z",
            "2026-12-07T14:05+02:00",
        ):
            page = await http.get("/admin/jobs", params={"status": "all", "to": at})
            assert page.status_code == 200, (at, page.text)


async def test_a_job_page_shows_an_error_history_that_is_not_a_list(
    pool: asyncpg.Pool, db_url: str, admin: str
) -> None:
    """errors is jsonb, and a plain-SQL writer may store any JSON value in it: a number or a
    boolean made the job page a 500 (its length was taken); such a history is shown as JSON."""
    a, _b, _ = await seed(pool)
    rows = await pool.fetch(
        "INSERT INTO job_queue (workspace_id, job_type, payload, status, errors)"
        " SELECT $1, 'noop', '{}', 'error', e"
        " FROM unnest(ARRAY['5', 'true', '\"seven\"', '{\"attempt\": 1}']::jsonb[]) AS e"
        " RETURNING id, errors::text",
        a,
    )
    headers = workspace_bearer(db_url, a)
    async with httpx.AsyncClient(base_url=admin, headers=headers) as http:
        for job_id, errors in rows:
            page = await http.get(f"/admin/jobs/{job_id}")
            assert page.status_code == 200, errors
            shown = re.search(r'<pre id="errors">(.*?)</pre>', page.text, re.S)
            assert shown and html.unescape(shown[1]).replace("\n", "").replace(" ", "") == (
                errors.replace(" ", "")
            ), (errors, page.text)


async def test_overview_counts_of_paused_and_capped_types_are_the_token_s_own(
    pool: asyncpg.Pool, db_url: str, admin: str
) -> None:
    """The pauses and limits are queue-wide, but the jobs they hold are a workspace's: a
    workspace token's overview counts only its own waiting and running jobs beside them (it
    counted every workspace's, so A read how many srt_parse jobs B had)."""
    a, b, _ = await seed(pool)
    for ws, waiting, running in ((a, 1, 1), (b, 4, 2)):
        await pool.execute(
            "INSERT INTO job_queue (workspace_id, job_type, payload, status)"
            " SELECT $1, 'srt_parse', '{}', s::job_status FROM unnest($2::text[]) AS s",
            ws,
            ["pending"] * waiting + ["running"] * running,
        )
    await store.pause_type(pool, "srt_parse", "ops", "parser bug")
    await store.set_type_limit(pool, "srt_parse", 5)

    async def figures(workspace: UUID | None) -> tuple[str, str]:
        token = auth.new_token()  # as `admin-token create` makes it, without its process
        await admin_store.create_token(pool, auth.digest(token), workspace, None)
        headers = {"authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(base_url=admin, headers=headers) as http:
            page = (await http.get("/admin")).text
        paused = re.search(
            r'<tr><td class="text">srt_parse</td><td>[^<]*</td><td class="text"[^>]*>ops</td>'
            r'<td class="text">parser bug</td><td>(\d+)</td>',
            page,
        )
        capped = re.search(
            r'<tr><td>job type</td><td class="text">srt_parse</td><td>5</td><td>(\d+)</td>', page
        )
        assert paused and capped, page
        return paused[1], capped[1]

    assert await figures(a) == ("1", "1")
    assert await figures(b) == ("4", "2")
    assert await figures(None) == ("5", "3")


async def test_an_overview_link_lists_its_job_type_whatever_the_type_holds(
    pool: asyncpg.Pool, db_url: str, admin: str
) -> None:
    """The overview links each status and type to its list: a type holding &, #, + or % went
    into the link as it was, so the list filtered by another type (or none) and came up empty."""
    a, _b, _ = await seed(pool)
    job_type = "ai/a&b #c+d%20e"
    job = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload, status)"
        " VALUES ($1, $2, '{}', 'error') RETURNING id",
        a,
        job_type,
    )
    headers = workspace_bearer(db_url, a)
    async with httpx.AsyncClient(base_url=admin, headers=headers) as http:
        page = (await http.get("/admin")).text
        link = re.search(r'<a href="([^"]*)">error</a></td><td class="text">ai/a&amp;b', page)
        assert link, page
        listed = (await http.get(html.unescape(link[1]))).text
    assert re.findall(r'<tr data-job="([0-9a-f-]{36})"', listed) == [str(job)]


async def test_giant_job_types_and_unique_keys_keep_pages_and_events_small(
    pool: asyncpg.Pool, db_url: str, admin: str
) -> None:
    """job_type and unique_key are text of any length to a plain-SQL writer: 20 jobs with
    types of a megabyte made the list page 20 MB, and each live event carried its type whole.
    The admin reads the first admin_store.TEXT_SHOWN characters of each."""
    a, _b, _ = await seed(pool)
    ids = await pool.fetch(
        "INSERT INTO job_queue (workspace_id, job_type, payload, status, unique_key)"
        " SELECT $1, repeat('t', 1000000) || g, '{}', 'error', repeat('u', 1000000) || g"
        " FROM generate_series(1, 20) g RETURNING id",
        a,
    )
    headers = workspace_bearer(db_url, a)
    async with httpx.AsyncClient(base_url=admin, headers=headers) as http:
        listed = await http.get("/admin/jobs?status=error")
        shown = await http.get(f"/admin/jobs/{ids[0][0]}")
    assert listed.status_code == shown.status_code == 200
    assert listed.text.count('<tr data-job="') == 25 and len(listed.content) < 300_000
    assert "t" * admin_store.TEXT_SHOWN in shown.text and "u" * admin_store.TEXT_SHOWN in shown.text
    assert len(shown.content) < 100_000, len(shown.content)
    async with pool.acquire() as conn:
        events = await admin_store.jobs_for_events(conn, [r[0] for r in ids])
    assert {len(e["job_type"]) for e in events} == {admin_store.TEXT_SHOWN}


async def test_the_dashboard_counts_giant_waiting_job_types_by_their_first_characters(
    pool: asyncpg.Pool, db_url: str, admin: str
) -> None:
    """The dashboard's queue depth is by job type: 20 waiting jobs of types of a megabyte made
    the page 20 MB. It names each type by its first admin_store.TEXT_SHOWN characters."""
    a, _b, _ = await seed(pool)
    await pool.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload)"
        " SELECT $1, repeat('t', 1000000) || g, '{}' FROM generate_series(1, 20) g",
        a,
    )
    headers = workspace_bearer(db_url, a)
    async with httpx.AsyncClient(base_url=admin, headers=headers) as http:
        page = await http.get("/admin/dashboard")
    assert page.status_code == 200
    assert "t" * admin_store.TEXT_SHOWN in page.text
    assert len(page.content) < 300_000, len(page.content)


async def test_the_login_form_is_read_only_up_to_a_token_s_size(admin: str) -> None:
    """Login is open to anyone and reads its form before any check: Starlette's own bounds (1,000
    fields of up to 1 MB) let one request make the server hold a gigabyte. A login form is a
    token: a field over auth.LOGIN_FIELD_MAX bytes, more than a few fields, or a file is a 400."""
    async with httpx.AsyncClient(base_url=admin) as http:
        for form in (
            {"token": "slj_" + "x" * (auth.LOGIN_FIELD_MAX + 1)},
            {f"f{i}": "x" for i in range(50)},
        ):
            refused = await http.post("/admin/login", data=form)
            assert refused.status_code == 400, refused.status_code
        # Nor a file (Starlette spools each to disk, of any size).
        upload = await http.post("/admin/login", files={"token": ("t", b"slj_" + b"x" * 100)})
        assert upload.status_code == 400, upload.status_code
        # Nor a body of separators alone, which holds no field to count: declared, or sent in
        # chunks with no length (it was read and parsed whole, a 401 after every byte).
        for chunked in (False, True):
            body = separators(auth.LOGIN_BODY_MAX + 1024, chunked)
            refused = await http.post("/admin/login", content=body, headers=URLENCODED)
            assert refused.status_code == 400, refused.status_code
        assert (await http.post("/admin/login", data={"token": "slj_x"})).status_code == 401


URLENCODED = {"content-type": "application/x-www-form-urlencoded"}


def separators(n: int, chunked: bool = False) -> bytes | AsyncIterator[bytes]:
    """A form body of `n` "&" (a multiple of 1 kB when chunked): whole, or in 1 kB chunks with
    no length declared."""
    if not chunked:
        return b"&" * n

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(n // 1024):
            yield b"&" * 1024

    return chunks()


async def test_short_job_links_tell_jobs_made_in_the_same_millisecond_apart(
    pool: asyncpg.Pool, db_url: str, admin: str
) -> None:
    """The ids the worker makes are UUIDv7: jobs enqueued together (a graph, a batch) share the
    first 12 digits, the millisecond. The job list cut ids to their first 11 digits, the graph
    and the workers page to 8, so a graph's jobs, or the jobs a worker runs, were links that
    all read the same. Every short link now names the id's start and its (random) end."""
    a, _b, _ = await seed(pool)
    ms = "01a24fba-622c-7"
    ids = [UUID(f"{ms}{n}69-9863-39ed34ef1ef{n}") for n in range(3)]
    await pool.execute(
        "INSERT INTO job_queue (id, workspace_id, job_type, payload)"
        " SELECT i, $2, 'noop', '{}' FROM unnest($1::uuid[]) i",
        ids,
        a,
    )
    await pool.execute(
        "INSERT INTO job_dependencies (parent_id, child_id) VALUES ($1, $2), ($1, $3)", *ids
    )
    worker = uuid4()
    await store.register_worker(pool, worker, "render-1", 1, ["noop"], 600)
    await pool.execute(
        "UPDATE job_queue SET status = 'running', worker_id = $1, attempts = 1"
        " WHERE id = ANY($2::uuid[])",
        worker,
        ids,
    )

    def link_texts(page: str) -> set[str]:
        texts = {re.findall(rf'<a href="/admin/jobs/{i}">([^<]*)</a>', page)[0] for i in ids}
        assert all(text.startswith(ms[:8]) for text in texts), texts
        return texts

    async with httpx.AsyncClient(base_url=admin, headers=workspace_bearer(db_url, a)) as http:
        for path in ("/admin/jobs?status=all", f"/admin/jobs/{ids[0]}/graph", "/admin/workers"):
            page = (await http.get(path)).text
            assert len(link_texts(page)) == len(ids), (path, link_texts(page))


async def test_every_page_shows_times_one_way_in_utc(
    pool: asyncpg.Pool, db_url: str, admin: str
) -> None:
    """The job list showed a time as 2026-03-04 05:06:07, the job page as Python prints it
    (2026-03-04 05:06:07.891000+00:00), its error history as the worker's JSON wrote it
    (2026-03-04T06:06:07.500+01:00, another zone), and the workers page a heartbeat as 05:06:07
    with no date, however many days old. Every page now shows one format, in UTC, and says
    so; the job page to the millisecond."""
    a, _b, _ = await seed(pool)
    at = datetime(2026, 3, 4, 5, 6, 7, 891000, tzinfo=UTC)
    job = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload, status, attempts, created_at,"
        " scheduled_for, started_at, completed_at, error_msg, errors)"
        " VALUES ($1, 'noop', '{}', 'error', 1, $2::timestamptz, $2::timestamptz,"
        " $2::timestamptz, $2::timestamptz, 'boom', jsonb_build_array(jsonb_build_object("
        " 'attempt', 1, 'at', '2026-03-04T06:06:07.500+01:00', 'class', 'permanent',"
        " 'message', 'boom'))) RETURNING id",
        a,
        at,
    )
    worker = uuid4()
    await store.register_worker(pool, worker, "render-1", 1, ["noop"], 600)
    await pool.execute(
        "UPDATE job_workers SET started_at = $2::timestamptz, last_heartbeat_at = $2::timestamptz"
        " WHERE id = $1",
        worker,
        at,
    )
    async with httpx.AsyncClient(base_url=admin, headers=workspace_bearer(db_url, a)) as http:
        page = (await http.get(f"/admin/jobs/{job}")).text
        assert page.count("<dd>2026-03-04 05:06:07.891 UTC</dd>") == 4, page
        assert "<td>2026-03-04 05:06:07.500</td>" in page and "At (UTC)" in page, page
        listed = (await http.get("/admin/jobs?status=error")).text
        assert listed.count('<td class="at">2026-03-04 05:06:07</td>') == 2, listed
        assert "Created (UTC)" in listed, listed
        workers = (await http.get("/admin/workers")).text
        assert workers.count('<td class="at">2026-03-04 05:06:07</td>') == 2, workers
        # A history's `at` is whatever JSON its writer stored: shown as it is when no time.
        await pool.execute(
            'UPDATE job_queue SET errors = \'[5, {"at": 7}, {"at": "soon"}, {"at": [1]}]\''
            " WHERE id = $1",
            job,
        )
        odd = await http.get(f"/admin/jobs/{job}")
        assert odd.status_code == 200 and "<td>soon</td>" in odd.text, odd.text
    assert "+00:00" not in page + listed + workers


async def test_a_stream_opens_with_the_present_state_of_its_page_s_jobs(
    pool: asyncpg.Pool, db_url: str, admin: str
) -> None:
    """A page's stream sent only changes made after it subscribed, and a page subscribes after
    it has rendered: a change in between (a running job cancelled from its page, which the
    worker ends within milliseconds of the redirect) reached no page, and the page showed the
    job running until reloaded. A stream now opens with the present state of the jobs its page
    names (`?jobs=`), of the token's workspace only, then sends changes as before."""
    a, _b, b_job = await seed(pool)
    mine = await pool.fetchval(
        "SELECT id FROM job_queue WHERE workspace_id = $1 AND status = 'error' LIMIT 1", a
    )
    await pool.execute("UPDATE job_queue SET status = 'cancelled' WHERE id = $1", mine)
    jobs = f"{mine},{b_job},not-a-job,"
    async with (
        httpx.AsyncClient(base_url=admin, headers=workspace_bearer(db_url, a), timeout=30) as http,
        http.stream("GET", f"/admin/events?jobs={jobs}") as stream,
    ):
        lines = stream.aiter_lines()

        async def next_event() -> dict[str, object]:
            async with asyncio.timeout(10):
                while not (line := await anext(lines)).startswith("data: "):
                    pass
            event: dict[str, object] = orjson.loads(line[6:])
            return event

        first = await next_event()
        assert (first["id"], first["status"]) == (str(mine), "cancelled"), first
        await pool.execute("UPDATE job_queue SET status = 'error' WHERE id = $1", mine)
        changed = await next_event()  # B's job never comes: the next is this change
        assert (changed["id"], changed["status"]) == (str(mine), "error"), changed


async def test_the_overview_of_an_empty_workspace_says_so(
    pool: asyncpg.Pool, db_url: str, admin: str
) -> None:
    """The overview's tables of jobs by status and of the last hour's throughput were a bare
    header row for a workspace with no jobs, where every other table of the view says it is
    empty. They now say so too."""
    await seed(pool)
    empty = await make_workspace(pool, "Empty")
    async with httpx.AsyncClient(base_url=admin, headers=workspace_bearer(db_url, empty)) as http:
        page = (await http.get("/admin")).text
    counts = re.search(r'<table class="counts" id="counts">.*?</table>', page, re.S)
    throughput = re.search(r'<table class="counts" id="throughput">.*?</table>', page, re.S)
    assert counts and 'class="empty">no jobs<' in counts[0], page
    assert throughput and 'class="empty">no job finished in the last hour<' in throughput[0], page


async def test_a_finished_job_names_its_last_worker_not_a_lease(
    pool: asyncpg.Pool, db_url: str, admin: str
) -> None:
    """A job keeps the id of the worker that last ran it. A finished job's page named that
    worker its "Lease holder", with the worker's present lease ("lease to" a time still to
    come), as if the job were held. It now names the worker as the one that last ran it, and
    only a running job's page shows a lease."""
    a, _b, _ = await seed(pool)
    done, running = await new_jobs(pool, a, 2)
    worker = uuid4()
    await store.register_worker(pool, worker, "render-1", 1, ["noop"], 600)
    await pool.execute(
        "UPDATE job_queue SET worker_id = $1, attempts = 1,"
        " status = CASE WHEN id = $2 THEN 'completed' ELSE 'running' END::job_status,"
        " completed_at = CASE WHEN id = $2 THEN now() END WHERE id IN ($2, $3)",
        worker,
        done,
        running,
    )
    async with httpx.AsyncClient(base_url=admin, headers=workspace_bearer(db_url, a)) as http:
        finished = (await http.get(f"/admin/jobs/{done}")).text
        held = (await http.get(f"/admin/jobs/{running}")).text
    assert "<dt>Last run by</dt>" in finished and "lease to" not in finished, finished
    assert "<dt>Lease holder</dt>" in held and "render-1, pid 1, lease to" in held, held


async def test_a_login_goes_to_the_page_the_browser_asked_for(
    pool: asyncpg.Pool, db_url: str, admin: str
) -> None:
    """A page opened logged out (a job's link sent in a chat) went to the login page, and the
    login to the job list: the link was lost. The login page now names the page asked for, and
    the login goes there; a `next` that is no page of this view (another host, a scheme, a
    backslash) goes to the job list, as before."""
    a, _b, _ = await seed(pool)
    job = await pool.fetchval("SELECT id FROM job_queue WHERE workspace_id = $1 LIMIT 1", a)
    token = token_for(db_url, "--workspace", str(a))
    asked = f"/admin/jobs/{job}/graph?x=1"
    ours = {"origin": admin, "sec-fetch-site": "same-origin"}
    async with httpx.AsyncClient(base_url=admin) as http:
        sent = await http.get(asked, headers=BROWSER)
        assert sent.status_code == 303, sent.text
        login_page = (await http.get(sent.headers["location"])).text
        assert f'name="next" value="{html.escape(asked)}"' in login_page, login_page
        done = await http.post("/admin/login", data={"token": token, "next": asked}, headers=ours)
        assert (done.status_code, done.headers["location"]) == (303, asked)
        assert (await http.get("/admin/jobs", headers=BROWSER)).headers["location"] == (
            "/admin/login"
        )
        for elsewhere in (
            "//evil.example/admin",
            "https://evil.example/admin",
            "/\\evil.example",
            "/adminx",
            "/admin/login?next=/admin",
            "",
        ):
            done = await http.post(
                "/admin/login", data={"token": token, "next": elsewhere}, headers=ours
            )
            assert done.headers["location"] == "/admin/jobs", elsewhere
            page = (await http.get(f"/admin/login?{urlencode({'next': elsewhere})}")).text
            assert 'name="next" value="/admin/jobs"' in page, elsewhere


async def test_an_action_posted_after_the_session_ran_out_comes_back_to_its_page(
    pool: asyncpg.Pool, db_url: str, admin: str
) -> None:
    """A retry or cancel clicked after the session ended was sent to the login page naming the
    action's own URL, which the browser then loaded: a 405 (for a bulk retry, "No such job
    bulk-retry"). The login names the page the form was on, when the browser says it was one
    of this view's, and the job list otherwise."""
    a, _b, _ = await seed(pool)
    job = await pool.fetchval("SELECT id FROM job_queue WHERE workspace_id = $1 LIMIT 1", a)
    page = f"/admin/jobs/{job}?x=1"
    expired = {**BROWSER, "cookie": f"{auth.COOKIE}=gone"}
    async with httpx.AsyncClient(base_url=admin) as http:
        for referer, back in (
            (f"{admin}{page}", f"/admin/login?{urlencode({'next': page})}"),
            ("https://evil.example/admin/jobs", "/admin/login"),
            (None, "/admin/login"),
        ):
            headers = expired if referer is None else {**expired, "referer": referer}
            sent = await http.post(f"/admin/jobs/{job}/retry", data={"csrf": "x"}, headers=headers)
            assert (sent.status_code, sent.headers["location"]) == (303, back), referer


async def test_with_no_job_due_the_pages_say_nothing_is_due(
    pool: asyncpg.Pool, db_url: str, admin: str
) -> None:
    """With no job due, the overview and the dashboard said the oldest due job had waited 0.0
    s, which reads as a due job taken at once. They say nothing is due; /metrics keeps 0."""
    empty = await make_workspace(pool, "Empty")
    async with httpx.AsyncClient(base_url=admin, headers=workspace_bearer(db_url, empty)) as http:
        overview = (await http.get("/admin")).text
        dashboard = (await http.get("/admin/dashboard")).text
        metrics = (await http.get("/metrics")).text
    assert '<strong id="oldest">nothing due</strong>' in overview, overview
    assert '<strong id="oldest-due">nothing due</strong>' in dashboard, dashboard
    assert "sidelinja_oldest_due_job_age_seconds 0.0" in metrics, metrics
    await pool.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload, scheduled_for)"
        " VALUES ($1, 'noop', '{}', now() - interval '90 s')",
        empty,
    )
    async with httpx.AsyncClient(base_url=admin, headers=workspace_bearer(db_url, empty)) as http:
        overview = (await http.get("/admin")).text
    assert re.search(r'Oldest due job waiting: <strong id="oldest">9\d\.\d s</strong>', overview)
