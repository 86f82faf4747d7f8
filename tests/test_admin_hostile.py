"""The admin app against one hostile or absurd value: a form, a query parameter, a row written by
plain SQL, many stream clients. Each must get a clear 4xx or a bounded answer, never a 500, a
page of unbounded size or a process that holds unbounded memory."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from urllib.parse import urlsplit
from uuid import UUID, uuid4

import asyncpg
import httpx
import pytest

from sidelinja_worker.admin import auth, dashboard, events, gate, web
from sidelinja_worker.admin import store as admin_store
from sidelinja_worker.admin.events import EventHub
from sidelinja_worker.admin.store import SHOW_MAX_BYTES, Scope, jobs_for_events
from sidelinja_worker.queue.store import OTHER_TYPES
from tests.admin_fixtures import (  # noqa: F401 (fixture)
    admin_fixture,
    seed,
    serve_admin,
    workspace_bearer,
)
from tests.helpers import insert_jobs, make_workspace, wait_for
from tests.tcp_proxy import proxy_for
from tests.test_admin_http import URLENCODED, separators


async def test_every_form_is_read_only_up_to_a_few_short_fields(
    pool: asyncpg.Pool, db_url: str, admin: str
) -> None:
    """Every form was read with Starlette's own bounds (1,000 fields of 1 MB, files spooled to
    disk), logout's for any cookie whatever its value, before any check: one such request made
    the server hold a gigabyte. A form is a CSRF value and a few short fields: a field over
    web.FORM_FIELD_MAX bytes, more than web.FORM_FIELDS_MAX fields, or a file is a
    400, from anyone."""
    a, _b, _ = await seed(pool)
    job = await pool.fetchval("SELECT id FROM job_queue WHERE workspace_id = $1 LIMIT 1", a)
    headers = workspace_bearer(db_url, a)
    forms = (
        {"csrf": "x", "f": "x" * (web.FORM_FIELD_MAX + 1)},
        {f"f{i}": "x" for i in range(web.FORM_FIELDS_MAX + 1)},
    )
    async with httpx.AsyncClient(base_url=admin) as http:
        for form in forms:
            junk_cookie = await http.post(
                "/admin/logout", data=form, headers={"cookie": f"{auth.COOKIE}=x"}
            )
            assert junk_cookie.status_code == 400, junk_cookie.status_code
            for path in (f"/admin/jobs/{job}/retry", "/admin/jobs/bulk-retry", "/admin/pauses/x"):
                refused = await http.post(path, data=form, headers=headers)
                assert refused.status_code == 400, (path, refused.status_code)
        for chunked in (False, True):  # separators alone: no field to count, every byte parsed
            body = separators(web.FORM_BODY_MAX + 1024, chunked)
            junk_cookie = await http.post(
                "/admin/logout", content=body, headers={"cookie": f"{auth.COOKIE}=x", **URLENCODED}
            )
            assert junk_cookie.status_code == 400, junk_cookie.status_code
            body = separators(web.FORM_BODY_MAX + 1024, chunked)
            refused = await http.post(
                f"/admin/jobs/{job}/retry", content=body, headers={**headers, **URLENCODED}
            )
            assert refused.status_code == 400, refused.status_code
        upload = await http.post(
            "/admin/logout", files={"csrf": ("c", b"x")}, headers={"cookie": f"{auth.COOKIE}=x"}
        )
        assert upload.status_code == 400, upload.status_code


async def test_a_payload_search_for_any_number_is_a_page_never_a_500(
    pool: asyncpg.Pool, db_url: str, admin: str
) -> None:
    """A number in the payload search became a Python float: 400 digits became inf, sent to the
    database as `Infinity`, which is no JSON (a 500, on the list and on a bulk retry alike). A
    number is searched for as typed (jsonb compares numbers of any size exactly); one longer
    than forms.NUMBER_MAX characters, which PostgreSQL's numeric may not hold, or digits other
    than 0-9, as text."""
    a, _b, _ = await seed(pool)
    huge = "1" + "0" * 400 + ".5"
    wanted = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload, status)"
        " VALUES ($1, 'noop', jsonb_build_object('n', $2::numeric), 'error') RETURNING id",
        a,
        huge,
    )
    headers = {**workspace_bearer(db_url, a), "sec-fetch-site": "same-origin"}
    csrf = auth.csrf_for(headers["authorization"].removeprefix("Bearer "))
    async with httpx.AsyncClient(base_url=admin, headers=headers) as http:
        for value, listed in ((huge, [str(wanted)]), ("\u0663", []), ("-0.5", [])):
            page = await http.get("/admin/jobs", params={"status": "all", "payload": f"n={value}"})
            assert page.status_code == 200, (value[:20], page.status_code)
            assert re.findall(r'<tr data-job="([0-9a-f-]{36})"', page.text) == listed
            assert 'id="next"' not in page.text
        for value, retried in (("1." + "1" * 20_000, 0), (huge, 1)):
            form = {"csrf": csrf, "status": "error", "payload": f"n={value}"}
            sent = await http.post("/admin/jobs/bulk-retry", data=form)
            assert sent.status_code == 303, (value[:20], sent.status_code)
            assert f"retried={retried}" in sent.headers["location"]


async def test_the_dashboard_names_only_the_most_numerous_waiting_job_types(
    pool: asyncpg.Pool, db_url: str, admin: str
) -> None:
    """The dashboard gave each waiting job type a row, a day of per-minute figures and a chart:
    20,000 waiting jobs of as many types (any plain-SQL writer may enqueue them) made it 36 MB,
    7.5 s and 540 MB of the admin process's memory. Past the dashboard.TYPES_MAX types with
    the most waiting jobs, the rest are one row, counted together."""
    a, _b, _ = await seed(pool)
    await pool.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload)"
        " SELECT $1::uuid, 'type-' || g, '{}'::jsonb FROM generate_series(1, 2000) g"
        " UNION ALL SELECT $1::uuid, 'busy', '{}'::jsonb FROM generate_series(1, 3)",
        a,
    )
    async with httpx.AsyncClient(base_url=admin, headers=workspace_bearer(db_url, a)) as http:
        page = await http.get("/admin/dashboard")
    assert page.status_code == 200
    assert len(page.content) < 400_000, len(page.content)
    assert 'data-type="busy"' in page.text and f'data-type="{OTHER_TYPES}"' in page.text
    assert page.text.count("<tr data-type=") == dashboard.TYPES_MAX + 1
    assert '<strong id="depth">2003</strong>' in page.text


async def test_one_token_opens_a_bounded_number_of_live_streams(
    pool: asyncpg.Pool, db_url: str, admin: str
) -> None:
    """Each open stream holds a connection, checks its token every 2 s and confirms every event
    with a query of its own, and there was no bound: 6,000 idle streams of one token kept every
    page of every token waiting 1.5-2.9 s (8-40 ms before), and more exhaust the process's
    file descriptors. A token opens at most events.STREAMS_PER_TOKEN (429 past that; another
    token still gets its own), and a closed stream gives its place back."""
    a, b, _ = await seed(pool)
    mine, theirs = workspace_bearer(db_url, a), workspace_bearer(db_url, b)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=admin, limits=limits, timeout=30) as http:
        async with contextlib.AsyncExitStack() as open_streams:
            for _ in range(events.STREAMS_PER_TOKEN):
                opened = await open_streams.enter_async_context(
                    http.stream("GET", "/admin/events", headers=mine)
                )
                assert opened.status_code == 200
            async with http.stream("GET", "/admin/events", headers=mine) as refused:
                assert refused.status_code == 429, refused.status_code
            async with http.stream("GET", "/admin/events", headers=theirs) as other:
                assert other.status_code == 200
            page = await http.get("/admin/jobs", headers=mine)
            assert page.status_code == 200

        async def reopens() -> bool:
            async with http.stream("GET", "/admin/events", headers=mine) as again:
                return again.status_code == 200

        await wait_for(reopens, 10, "a closed stream's place is given back")


async def test_the_app_opens_a_bounded_number_of_live_streams(
    pool: asyncpg.Pool, db_url: str
) -> None:
    """However many tokens ask, the hub holds at most events.STREAMS_MAX streams (503 past it);
    one that ends gives its place back."""
    hub = EventHub(db_url, pool)
    queues = [hub.subscribe(Scope(uuid4(), None)) for _ in range(events.STREAMS_MAX)]
    with pytest.raises(events.TooManyStreams) as refused:
        hub.subscribe(Scope(uuid4(), None))
    assert refused.value.status_code == 503
    hub.unsubscribe(queues.pop())
    never_read = hub.stream(Scope(uuid4(), None))
    assert (await anext(never_read)).startswith(b"retry:")
    with pytest.raises(events.TooManyStreams):
        hub.subscribe(Scope(uuid4(), None))
    await never_read.aclose()
    hub.subscribe(Scope(uuid4(), None))


async def test_a_job_page_measures_a_compressed_payload_by_its_json_text(
    pool: asyncpg.Pool, db_url: str, admin: str
) -> None:
    """The job page showed a payload, result or error history stored in at most
    admin_store.SHOW_MAX_BYTES, and a progress report in 4 kB, counting compressed bytes: 10 MB
    of one letter is 115 kB compressed, so the page was 26 MB, and each live stream read a
    progress report of 300 kB with every event of such a job (the query that confirms the
    event reads the row's progress). Each is now shown only if its JSON text is within
    the bound too (measured only once the stored size is). A JSON null, which the page took for
    a value too big to show, is shown."""
    a, _b, _ = await seed(pool)
    job = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, status, payload, result, errors, progress)"
        " VALUES ($1, 'noop', 'error', jsonb_build_object('x', repeat('a', 10000000)),"
        "  (SELECT jsonb_agg(jsonb_build_object('k', 'v')) FROM generate_series(1, 300000)),"
        "  (SELECT jsonb_agg(jsonb_build_object('attempt', 1, 'message', 'm'))"
        "   FROM generate_series(1, 150000)),"
        "  jsonb_build_object('message', repeat('p', 300000)))"
        " RETURNING id",
        a,
    )
    stored = await pool.fetchrow(
        "SELECT pg_column_size(payload) AS payload, pg_column_size(result) AS result,"
        " pg_column_size(errors) AS errors, pg_column_size(progress) AS progress"
        " FROM job_queue WHERE id = $1",
        job,
    )
    assert max(stored["payload"], stored["result"], stored["errors"]) <= SHOW_MAX_BYTES
    assert stored["progress"] <= 4096, stored  # compressed: each is small as stored
    nothing = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload, result, errors)"
        " VALUES ($1, 'noop', 'null', 'null', 'null') RETURNING id",
        a,
    )
    async with httpx.AsyncClient(base_url=admin, headers=workspace_bearer(db_url, a)) as http:
        page = await http.get(f"/admin/jobs/{job}")
        nulls = await http.get(f"/admin/jobs/{nothing}")
    # A JSON null is shown as one, not called too big.
    assert nulls.status_code == 200 and "too big" not in nulls.text
    assert '<pre id="payload">null</pre>' in nulls.text
    assert page.status_code == 200
    assert len(page.content) < 100_000, len(page.content)
    for what in ("payload", "result", "error history"):
        assert re.search(rf"The {what} is [\d,]+ bytes as JSON text: too big to show", page.text)
    async with pool.acquire() as conn:
        (event,) = await jobs_for_events(conn, [job])
    assert event["progress"] is None


async def test_a_notification_is_confirmed_once_whatever_the_number_of_streams(
    pool: asyncpg.Pool, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each open stream confirmed every notification with a query of its own, and any role may
    NOTIFY as fast as it likes: a flood of forged notifications (120,000 a second from one
    client) kept 50 streams querying back to back, and pages waited 5-13 s (7 ms before the
    flood). The hub confirms what arrives once per workspace its streams watch, however many
    streams watch it."""
    a = await make_workspace(pool, "A")
    queries = 0
    read_rows = admin_store.jobs_for_events

    async def counted(conn: asyncpg.Connection, ids: list[UUID]) -> list[asyncpg.Record]:
        nonlocal queries
        queries += 1
        return await read_rows(conn, ids)

    monkeypatch.setattr(admin_store, "jobs_for_events", counted)
    hub = EventHub(db_url, pool)
    await hub.start()
    streams = [hub.stream(Scope(uuid4(), a)) for _ in range(20)]
    try:
        for s in streams:
            assert b"connected" in await anext(s)
        await insert_jobs(pool, a, 1)
        frames = [await asyncio.wait_for(anext(s), 5) for s in streams]
    finally:
        for s in streams:
            await s.aclose()
        await hub.stop()
    assert all(f.startswith(b"data: ") for f in frames)
    assert queries == 1, queries


@pytest.mark.parametrize("path", ["/admin/jobs?status=all", "/admin", "/metrics"])
async def test_heavy_reads_leave_the_pool_to_the_other_pages(
    pool: asyncpg.Pool, db_url: str, admin: str, path: str
) -> None:
    """A job list may read a status's whole index (a payload search over all time, a small
    workspace's completed jobs under row-level security: 0.5 s at 1,000,000 jobs, growing with
    the table), the overview, dashboard and /metrics count the whole table (0.6-1.0 s there),
    and there was no bound on how many ran: 16 such searches at once held every connection of
    the pool, and a job page waited 3-7 s. At most gate.READS_MAX of them run at once (the
    rest wait without a connection) and a token runs at most gate.READS_PER_TOKEN (429 past
    that). Here they are held by a lock on job_queue."""
    a, b, _ = await seed(pool)
    tokens = [workspace_bearer(db_url, ws) for ws in (a, b) for _ in range(3)]
    async with httpx.AsyncClient(base_url=admin, timeout=60) as http, pool.acquire() as lock:
        tx = lock.transaction()
        await tx.start()
        await lock.execute("LOCK TABLE job_queue IN ACCESS EXCLUSIVE MODE")
        lists = [
            asyncio.create_task(http.get(path, headers=headers))
            for headers in tokens
            for _ in range(gate.READS_PER_TOKEN)
        ]
        try:

            async def waiting() -> bool:
                return bool(
                    await pool.fetchval(
                        "SELECT count(*) >= $1 FROM pg_stat_activity"
                        " WHERE wait_event_type = 'Lock' AND application_name = 'sidelinja-admin'"
                        " AND datname = current_database()",
                        gate.READS_MAX,
                    )
                )

            await wait_for(waiting, 30, "the lists wait on the lock")
            async with asyncio.timeout(10):
                refused = await http.get(path, headers=tokens[0])
                other_page = await http.get("/admin/jobs/not-a-job", headers=tokens[0])
            assert refused.status_code == 429, refused.status_code
            assert other_page.status_code == 404, other_page.status_code
        finally:
            await tx.rollback()
        assert {r.status_code for r in await asyncio.gather(*lists)} == {200}


@pytest.fixture(name="quick_admin")
async def quick_admin_fixture(db_url: str) -> str:
    """The admin app with a read bound of 1 s (`--read-timeout`), so a read held by a lock gives
    up within a second."""
    return await serve_admin(db_url, {"SIDELINJA_ADMIN_READ_TIMEOUT": "1s"})


async def test_a_read_held_by_a_lock_ends_at_its_bound_and_its_connection_serves_again(
    pool: asyncpg.Pool, db_url: str, quick_admin: str
) -> None:
    """The admin's reads had no bound: a page held by a lock (here the ACCESS EXCLUSIVE a
    migration takes on job_queue, in an open transaction) kept its request and a connection of
    the pool for as long as the lock was held, forever if nobody let go. Each page now gives up
    at the read bound (1 s here) with a 503 and one line naming it, as an HTML page, JSON or
    text as the client asks; the connections that waited go back to the pool idle, every page
    answers 200 once the lock goes, and a live stream open across it all still delivers."""
    a, _b, _ = await seed(pool)
    job = await pool.fetchval("SELECT id FROM job_queue WHERE workspace_id = $1 LIMIT 1", a)
    tokens = [workspace_bearer(db_url, a) for _ in range(2)]
    # The four heavy reads first, two per token (gate.READS_PER_TOKEN), then the other pages.
    pages = [
        ("/admin/jobs?status=all&payload=episode%3D7", "text/html"),
        ("/admin", "application/json"),
        ("/admin/dashboard", "*/*"),
        ("/metrics", "*/*"),
        (f"/admin/jobs/{job}", "text/html"),
        (f"/admin/jobs/{job}/graph", "application/json"),
        ("/admin/workers", "*/*"),
    ]
    line = "the database took longer than 1 s for this page; try a narrower filter"
    held: set[int] = set()  # the admin's connections seen waiting on the lock

    async def timed(path: str, headers: dict[str, str]) -> tuple[httpx.Response, float]:
        start = time.monotonic()
        return await http.get(path, headers=headers), time.monotonic() - start

    async with (
        httpx.AsyncClient(base_url=quick_admin, timeout=30) as http,
        http.stream("GET", "/admin/events", headers=tokens[0]) as stream,
        pool.acquire() as lock,
    ):
        lines = stream.aiter_lines()
        assert await anext(lines) == "retry: 2000"
        tx = lock.transaction()
        await tx.start()
        await lock.execute("LOCK TABLE job_queue IN ACCESS EXCLUSIVE MODE")
        asked = [
            asyncio.create_task(timed(path, {**tokens[i % 2], "accept": accept}))
            for i, (path, accept) in enumerate(pages)
        ]
        try:

            async def answered() -> bool:
                held.update(
                    await pool.fetchval(
                        "SELECT coalesce(array_agg(pid), '{}') FROM pg_stat_activity"
                        " WHERE wait_event_type = 'Lock' AND application_name = 'sidelinja-admin'"
                        " AND datname = current_database()"
                    )
                )
                return all(t.done() for t in asked)

            await wait_for(answered, 10, "every page answers while the lock is held")
        finally:
            await tx.rollback()
            await asyncio.gather(*asked, return_exceptions=True)
        for (path, accept), task in zip(pages, asked):
            page, took = task.result()
            assert page.status_code == 503, (path, page.status_code, page.text[:200])
            assert took < 5, (path, took)
            if accept == "text/html":
                assert page.headers["content-type"].startswith("text/html"), path
                assert f'<p id="slow">{line}</p>' in page.text, path
            elif accept == "application/json":
                assert page.json() == {"error": line}, path
            else:
                assert page.text == line, path
        assert held, "no page was seen waiting on the lock"

        async def idle() -> bool:
            rows = await pool.fetch(
                "SELECT state FROM pg_stat_activity WHERE pid = ANY($1::int[])", list(held)
            )
            return len(rows) == len(held) and all(r["state"] == "idle" for r in rows)

        await wait_for(idle, 10, "the connections that waited are idle in the pool")
        for path, accept in pages:
            page = await http.get(path, headers={**tokens[0], "accept": accept})
            assert page.status_code == 200, (path, page.status_code, page.text[:200])
        await insert_jobs(pool, a, 1)
        async with asyncio.timeout(10):
            while not (frame := await anext(lines)).startswith("data: "):
                pass
        assert '"status":"pending"' in frame, frame


async def test_the_too_slow_page_has_the_navigation_bar_of_every_page(
    pool: asyncpg.Pool, db_url: str, quick_admin: str
) -> None:
    """The read bound's 503 page was a bare page with two links, no navigation bar, no scope and
    no way to log out. It now has the bar every page has: the session's scope and its logout
    when the session was checked (a page held by a lock on job_queue), the links alone when the
    session check itself was held (a lock on admin_tokens): never a scope it does not know."""
    a, _b, _ = await seed(pool)
    headers = {**workspace_bearer(db_url, a), "accept": "text/html"}
    csrf = auth.csrf_for(headers["authorization"].removeprefix("Bearer "))
    nav = [
        f'<a href="{p}">' for p in ("/admin", "/admin/dashboard", "/admin/jobs", "/admin/workers")
    ]

    async def held_page(table: str) -> str:
        async with pool.acquire() as lock, lock.transaction():
            await lock.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
            page = await http.get("/admin/jobs?status=all", headers=headers)
        assert page.status_code == 503, (table, page.status_code, page.text[:200])
        assert '<p id="slow">the database took longer than' in page.text, table
        assert all(link in page.text for link in nav), (table, page.text)
        return page.text

    async with httpx.AsyncClient(base_url=quick_admin, timeout=30) as http:
        page = await held_page("job_queue")
        assert f"workspace {a}" in page and f'name="csrf" value="{csrf}"' in page, page
        page = await held_page("admin_tokens")
        assert "workspace" not in page and "all workspaces" not in page, page
        assert "/admin/logout" not in page, page


async def test_a_stream_whose_token_check_is_held_ends_cleanly_and_a_new_one_delivers(
    pool: asyncpg.Pool, db_url: str, quick_admin: str
) -> None:
    """A live stream checks its token every events.REVALIDATE_S on the pool, under the read
    bound. A check the database does not answer in time (here admin_tokens is held by a lock)
    ends the stream as a revoked token does, a complete answer the page reconnects after (its
    `retry`), never an error that cuts the connection mid-body; once the lock goes, a new
    stream with the same token delivers events."""
    a, _b, _ = await seed(pool)
    headers = workspace_bearer(db_url, a)
    async with httpx.AsyncClient(base_url=quick_admin, timeout=30) as http:
        async with (
            http.stream("GET", "/admin/events", headers=headers) as stream,
            pool.acquire() as lock,
        ):
            lines = stream.aiter_lines()
            assert await anext(lines) == "retry: 2000"
            tx = lock.transaction()
            await tx.start()
            await lock.execute("LOCK TABLE admin_tokens IN ACCESS EXCLUSIVE MODE")
            try:
                async with asyncio.timeout(15):
                    rest = [line async for line in lines]  # a cut body raises here
            finally:
                await tx.rollback()
        assert not [line for line in rest if line.startswith("data: ")], rest
        async with http.stream("GET", "/admin/events", headers=headers) as again:
            lines = again.aiter_lines()
            assert await anext(lines) == "retry: 2000"
            await insert_jobs(pool, a, 1)
            async with asyncio.timeout(10):
                while not (frame := await anext(lines)).startswith("data: "):
                    pass
        assert '"status":"pending"' in frame, frame


async def test_a_page_of_slow_statements_ends_at_the_read_bound_as_a_whole(
    pool: asyncpg.Pool, db_url: str
) -> None:
    """The read bound held each statement, not the page: a page of several statements (the
    overview runs six) each a little under the bound took that many times it. Here the overview's
    first statement waits ~1.5 s on a lock on job_type_limits, its second on a lock on
    job_type_pauses, each under the read bound of 2 s; the page now ends at 2 s plus
    gate.PAGE_GRACE_S with the read bound's 503, before the second lock goes (on the code
    before, a 200 after both), and its cancelled statement's connection serves again."""
    a, _b, _ = await seed(pool)
    admin = await serve_admin(db_url, {"SIDELINJA_ADMIN_READ_TIMEOUT": "2s"})
    bound_s = 2 + gate.PAGE_GRACE_S
    headers = {**workspace_bearer(db_url, a), "accept": "application/json"}

    async def waited_on(table: str) -> bool:
        """An admin statement has waited 1.5 s on the lock on `table`."""
        return bool(
            await pool.fetchval(
                "SELECT count(*) > 0 FROM pg_stat_activity s JOIN pg_locks l ON l.pid = s.pid"
                " WHERE NOT l.granted AND l.relation = $1::regclass"
                " AND s.application_name = 'sidelinja-admin'"
                " AND clock_timestamp() - s.query_start > interval '1.5 s'",
                table,
            )
        )

    async with (
        httpx.AsyncClient(base_url=admin, timeout=30) as http,
        pool.acquire() as first,
        pool.acquire() as second,
    ):
        locks = []
        for conn, table in ((first, "job_type_limits"), (second, "job_type_pauses")):
            tx = conn.transaction()
            await tx.start()
            await conn.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
            locks.append(tx)
        start = time.monotonic()
        page_task = asyncio.create_task(http.get("/admin", headers=headers))
        released = 0
        try:
            for tx, table in zip(locks, ("job_type_limits", "job_type_pauses")):

                async def waited_or_answered(table: str = table) -> bool:
                    return page_task.done() or await waited_on(table)

                await wait_for(waited_or_answered, 30, f"the page waits 1.5 s on {table}")
                if page_task.done():
                    break
                await tx.rollback()
                released += 1
        finally:
            for tx in locks[released:]:
                await tx.rollback()
        page = await page_task
        took = time.monotonic() - start
    assert page.status_code == 503, (page.status_code, page.text[:200], took)
    assert released == 1, f"the page answered after {released} of 2 locks went"
    assert page.json() == {
        "error": f"the database took longer than {bound_s:g} s for this page; try a narrower filter"
    }
    assert bound_s - 0.1 < took < bound_s + 2, took
    async with httpx.AsyncClient(base_url=admin, timeout=30) as http:
        for _ in range(3):  # more than the one connection the cancel left behind, if it did
            again = await http.get("/admin", headers=headers)
            assert again.status_code == 200, (again.status_code, again.text[:200])


async def test_an_action_runs_under_its_own_longer_bound(
    pool: asyncpg.Pool, db_url: str, quick_admin: str
) -> None:
    """A cancel that runs through a large graph, or a bulk retry of up to
    actions.BULK_LIMIT jobs, may rightly take longer than a page: actions run under
    gate.ACTION_TIMEOUT_S, never the read bound. Here a cancel and a bulk retry wait for
    longer than the read bound (1 s) on a lock that holds every write to job_queue, and both
    complete once it goes."""
    a, _b, _ = await seed(pool)
    pending = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload) VALUES ($1, 'noop', '{}')"
        " RETURNING id",
        a,
    )
    headers = {**workspace_bearer(db_url, a), "sec-fetch-site": "same-origin"}
    csrf = auth.csrf_for(headers["authorization"].removeprefix("Bearer "))
    async with (
        httpx.AsyncClient(base_url=quick_admin, headers=headers, timeout=60) as http,
        pool.acquire() as lock,
    ):
        tx = lock.transaction()
        await tx.start()
        await lock.execute("LOCK TABLE job_queue IN SHARE MODE")  # as CREATE INDEX takes
        sent = [
            asyncio.create_task(http.post(f"/admin/jobs/{pending}/cancel", data={"csrf": csrf})),
            asyncio.create_task(
                http.post(
                    "/admin/jobs/bulk-retry",
                    data={"csrf": csrf, "status": "error", "type": "srt_parse"},
                )
            ),
        ]
        try:

            async def waited_past_the_read_bound() -> bool:
                # Or one answered already: the asserts below then say what it answered.
                return any(t.done() for t in sent) or await pool.fetchval(
                    "SELECT count(*) >= 2 FROM pg_stat_activity"
                    " WHERE wait_event_type = 'Lock' AND application_name = 'sidelinja-admin'"
                    " AND datname = current_database()"
                    " AND clock_timestamp() - query_start > interval '1.5 s'"
                )

            await wait_for(waited_past_the_read_bound, 30, "both actions wait past 1.5 s")
        finally:
            await tx.rollback()
            await asyncio.gather(*sent, return_exceptions=True)
        cancel, retry = (t.result() for t in sent)
    assert cancel.status_code == 303, (cancel.status_code, cancel.text[:200])
    assert cancel.headers["location"].endswith("?done=cancel")
    assert retry.status_code == 303, (retry.status_code, retry.text[:200])
    assert "retried=2" in retry.headers["location"]
    status = await pool.fetchval("SELECT status::text FROM job_queue WHERE id = $1", pending)
    assert status == "cancelled"


async def test_a_request_that_does_not_arrive_in_time_loses_its_connection(
    pool: asyncpg.Pool, db_url: str
) -> None:
    """uvicorn bounds only an idle keep-alive connection: a client that opened a connection and
    sent nothing, or dripped a request's head or body, kept it for as long as it liked, without
    a token (a file descriptor each, and for a body the handler waiting). A request must now
    arrive within `--request-timeout` (1 s here) or its connection is closed; a request that
    arrived, and a live stream that outlasts the bound, are not touched."""
    a, _, _ = await seed(pool)
    bearer = workspace_bearer(db_url, a)
    admin = await serve_admin(db_url, {"SIDELINJA_ADMIN_REQUEST_TIMEOUT": "1s"})
    where = urlsplit(admin)
    assert where.hostname is not None and where.port is not None
    async with (
        httpx.AsyncClient(base_url=admin, timeout=30) as http,
        http.stream("GET", "/admin/events", headers=bearer) as stream,
    ):
        assert stream.status_code == 200
        frames = stream.aiter_bytes()
        assert b": connected" in await anext(frames)
        silent = await asyncio.open_connection(where.hostname, where.port)
        head = await asyncio.open_connection(where.hostname, where.port)
        head[1].write(b"GET /admin/login HTTP/1.1\r\nHost: x\r\n")
        body = await asyncio.open_connection(where.hostname, where.port)
        body[1].write(
            b"POST /admin/login HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/x-www-form-urlencoded\r\n"
            b"Content-Length: 100\r\n\r\ntoken=ab"
        )
        started = time.monotonic()
        for reader, _writer in (silent, head, body):
            assert await asyncio.wait_for(reader.read(), 10) == b""  # closed by the admin
        assert time.monotonic() - started >= 0.5
        for _reader, writer in (silent, head, body):
            writer.close()
        assert (await http.get("/admin/login")).status_code == 200
        await insert_jobs(pool, a, 1)  # the stream, open for longer than the bound, goes on
        async with asyncio.timeout(10):
            while b"data: " not in await anext(frames):
                pass


async def test_pages_on_connections_that_stopped_answering_end_and_the_admin_recovers(
    pool: asyncpg.Pool, db_url: str
) -> None:
    """A dead network path to the database (its connections stay open; nothing answers,
    nothing resets) kept each page that took such a connection waiting for good: the admin's
    statements had no bound of asyncpg's own, and the server's statement_timeout never hears of
    them. Each now ends at the read bound plus 5 s (1 s here) with a 503, and the pool opens new
    connections: a page answers again."""
    a, _, _ = await seed(pool)
    bearer = workspace_bearer(db_url, a)
    proxy, via_proxy = await proxy_for(db_url)
    try:
        admin = await serve_admin(via_proxy, {"SIDELINJA_ADMIN_READ_TIMEOUT": "1s"})
        async with httpx.AsyncClient(base_url=admin, headers=bearer, timeout=30) as http:
            assert (await http.get("/admin/jobs")).status_code == 200
            assert proxy.black_hole() >= 1
            answers: list[int] = []
            started = time.monotonic()
            while not answers or answers[-1] != 200:
                assert time.monotonic() - started < 120, answers
                answers.append((await http.get("/admin/jobs")).status_code)  # hung for good
        assert set(answers) <= {200, 503}, answers
    finally:
        proxy.release_held()
        await proxy.close()
