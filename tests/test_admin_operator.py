"""The admin view's operator controls over HTTP: pause and resume a job type, the workers page
and draining a worker; a workspace token sees them but cannot use them."""

from __future__ import annotations

import html
import re
from uuid import UUID, uuid4

import asyncpg
import httpx

from sidelinja_worker.admin import auth
from sidelinja_worker.queue import store
from tests.admin_fixtures import (  # noqa: F401 (fixture)
    admin_fixture,
    new_jobs,
    seed,
    token_for,
    workspace_bearer,
)
from tests.helpers import cli, insert_jobs

SAME_SITE = {"sec-fetch-site": "same-origin"}


async def _csrf(http: httpx.AsyncClient) -> str:
    page = (await http.get("/admin")).text
    return page.split('name="csrf" value="', 1)[1].split('"', 1)[0]


async def test_pause_resume_and_drain_from_the_admin_view(
    pool: asyncpg.Pool, db_url: str, admin: str
) -> None:
    a, b, _ = await seed(pool)
    await insert_jobs(pool, a, 2, job_type_name="srt_parse")
    worker_id = uuid4()
    await store.register_worker(pool, worker_id, "host-1", 4242, ["noop"], 60, "9.9.9", 7)
    platform = {"authorization": f"Bearer {token_for(db_url, '--all')}", **SAME_SITE}
    confined = {"authorization": f"Bearer {token_for(db_url, '--workspace', str(b))}", **SAME_SITE}
    async with httpx.AsyncClient(base_url=admin, headers=platform) as http:
        csrf = await _csrf(http)
        form = {"csrf": csrf, "job_type": "srt_parse", "reason": "parser bug"}
        assert (await http.post("/admin/pauses/pause", data=form)).status_code == 303
        page = (await http.get("/admin")).text
        assert "parser bug" in page and "admin token" in page
        workers = (await http.get("/admin/workers")).text
        assert "host-1" in workers and "4242" in workers and "9.9.9" in workers
        drained = await http.post(
            f"/admin/workers/{worker_id}/drain", data={"csrf": csrf, "drain": "1"}
        )
        assert drained.status_code == 303
        assert "draining" in (await http.get("/admin/workers")).text
    async with httpx.AsyncClient(base_url=admin, headers=confined) as http:
        csrf = await _csrf(http)
        assert "parser bug" in (await http.get("/admin")).text  # pauses are shown to all
        refused = await http.post(
            "/admin/pauses/resume", data={"csrf": csrf, "job_type": "srt_parse", "reason": "x"}
        )
        assert refused.status_code == 403
        refused = await http.post(f"/admin/workers/{worker_id}/drain", data={"csrf": csrf})
        assert refused.status_code == 403
    assert await pool.fetchval("SELECT count(*) FROM job_type_pauses") == 1
    async with httpx.AsyncClient(base_url=admin, headers=platform) as http:
        csrf = await _csrf(http)
        no_csrf = await http.post(
            "/admin/pauses/resume", data={"job_type": "srt_parse", "reason": "fixed"}
        )
        assert no_csrf.status_code == 403
        form = {"csrf": csrf, "job_type": "srt_parse", "reason": "fixed"}
        assert (await http.post("/admin/pauses/resume", data=form)).status_code == 303
    assert await pool.fetchval("SELECT count(*) FROM job_type_pauses") == 0
    audit = await pool.fetch("SELECT action, detail FROM admin_audit ORDER BY id")
    assert [a["action"] for a in audit] == ["pause", "drain", "resume"]
    assert audit[2]["detail"]["reason"] == "fixed"
    assert await pool.fetchval(
        "SELECT drain_requested_by FROM job_workers WHERE id = $1", worker_id
    )


async def test_search_by_id_prefix_and_payload_field(
    pool: asyncpg.Pool, db_url: str, admin: str
) -> None:
    """Id prefix, payload field (a number, in a day's window by default), with the other
    filters; a workspace token's search never reaches another workspace's jobs."""
    a, b, _ = await seed(pool)
    for ws, episode in ((a, 42), (a, 43), (b, 42)):
        await pool.execute(
            "INSERT INTO job_queue (workspace_id, job_type, payload, status, attempts, error_msg)"
            " VALUES ($1, 'noop', jsonb_build_object('episode_id', $2::int), 'error', 3, 'x')",
            ws,
            episode,
        )
    # An old job with the same payload: outside the default window of a payload search.
    await pool.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload, status, created_at)"
        " VALUES ($1, 'noop', '{\"episode_id\": 42}', 'error', now() - interval '3 days')",
        a,
    )
    target = await pool.fetchval(
        "SELECT id FROM job_queue WHERE workspace_id = $1 AND payload = '{\"episode_id\": 43}'", a
    )

    async def ids(token: str, query: str) -> set[str]:
        async with httpx.AsyncClient(
            base_url=admin, headers={"authorization": f"Bearer {token}"}
        ) as http:
            page = (await http.get(f"/admin/jobs?{query}")).text
        return {chunk.split('"', 1)[0] for chunk in page.split('data-job="')[1:]}

    platform = token_for(db_url, "--all")
    found = await ids(platform, "status=all&payload=episode_id%3D42")
    expected = await pool.fetch(
        "SELECT id::text FROM job_queue WHERE payload = '{\"episode_id\": 42}'"
        " AND created_at > now() - interval '1 day'"
    )
    assert found == {r[0] for r in expected} and len(found) == 2
    assert await ids(platform, f"status=all&id={str(target)[:8]}") == {str(target)}
    assert await ids(platform, f"status=error&id={str(target)[:13]}&payload=episode_id%3D43") == {
        str(target)
    }
    assert (
        await ids(platform, f"status=error&id={str(target)[:8]}&payload=episode_id%3D42") == set()
    )
    confined = token_for(db_url, "--workspace", str(b))
    mine = await ids(confined, "status=all&payload=episode_id%3D42")
    assert len(mine) == 1 and mine <= found


async def test_a_payload_search_for_a_number_past_64_bits_finds_it(
    pool: asyncpg.Pool, db_url: str, admin: str
) -> None:
    """jsonb holds numbers of any size, and the search box takes any digits: a number past
    64 bits (which the jsonb codec cannot encode) is searched for as the database holds it."""
    a, _b, _ = await seed(pool)
    big = "123456789012345678901234567890"
    wanted = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload, status)"
        " VALUES ($1, 'noop', jsonb_build_object('n', $2::numeric), 'error') RETURNING id",
        a,
        big,
    )
    await pool.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload, status)"
        " VALUES ($1, 'noop', '{\"n\": 1}', 'error')",
        a,
    )
    headers = workspace_bearer(db_url, a)
    async with httpx.AsyncClient(base_url=admin, headers=headers) as http:
        page = await http.get(f"/admin/jobs?status=all&payload=n%3D{big}")
    assert page.status_code == 200
    assert re.findall(r'<tr data-job="([0-9a-f-]{36})"', page.text) == [str(wanted)]


async def test_a_bulk_retry_retries_only_the_jobs_the_search_shows(
    pool: asyncpg.Pool, db_url: str, admin: str
) -> None:
    """ "Retry all matching" under a search by payload field or id prefix sends the search with
    the rest of the filter: it retries the jobs listed, not every failed job of the window."""
    a, _b, _ = await seed(pool)
    one = await pool.fetchval(
        "SELECT id::text FROM job_queue WHERE job_type = 'srt_parse' ORDER BY id LIMIT 1"
    )
    headers = workspace_bearer(db_url, a)
    async with httpx.AsyncClient(base_url=admin, headers=headers) as http:
        for query, listed in (("payload=episode%3D7", 3), (f"id={one[:13]}", 1)):
            page = (await http.get(f"/admin/jobs?status=all&{query}")).text
            assert page.count('<tr data-job="') == listed, query
            form = re.search(
                r'<form method="post" action="/admin/jobs/bulk-retry".*?</form>', page, re.S
            )
            assert form, query
            fields = dict(re.findall(r'name="(\w+)" value="([^"]*)"', form[0]))
            sent = await http.post(
                "/admin/jobs/bulk-retry", data={k: html.unescape(v) for k, v in fields.items()}
            )
            assert sent.status_code == 303, sent.text
            assert f"retried={listed}" in sent.headers["location"], (query, sent.headers)
            await pool.execute("UPDATE job_queue SET status = 'error' WHERE status = 'pending'")


async def test_a_nul_character_in_a_filter_or_form_field_is_a_400(
    pool: asyncpg.Pool, db_url: str, admin: str
) -> None:
    """PostgreSQL text and jsonb hold no NUL character, so a job type, payload field, pause
    reason or type naming one is refused with a 400 naming the field (it was a 500), and
    nothing is retried or paused."""
    await seed(pool)
    platform = {"authorization": f"Bearer {token_for(db_url, '--all')}", **SAME_SITE}
    async with httpx.AsyncClient(base_url=admin, headers=platform) as http:
        csrf = await _csrf(http)
        for query, field in (
            ("type=no%00op", "type"),
            ("payload=episode%3D7%00", "payload"),
            ("payload=epi%00sode%3D7", "payload"),
        ):
            listed = await http.get(f"/admin/jobs?status=all&{query}")
            assert listed.status_code == 400 and field in listed.text, (query, listed.text)
        retried = await http.post(
            "/admin/jobs/bulk-retry", data={"csrf": csrf, "status": "all", "type": "no\x00op"}
        )
        assert retried.status_code == 400, retried.text
        for form in (
            {"job_type": "noop\x00", "reason": "x"},
            {"job_type": "noop", "reason": "\x00"},
        ):
            paused = await http.post("/admin/pauses/pause", data={"csrf": csrf, **form})
            assert paused.status_code == 400, paused.text
    assert await pool.fetchval("SELECT count(*) FROM job_queue WHERE status = 'pending'") == 0
    assert await pool.fetchval("SELECT count(*) FROM job_type_pauses") == 0


async def test_a_retry_whose_unique_key_another_queued_job_holds_is_refused_or_left_out(
    pool: asyncpg.Pool, db_url: str, admin: str
) -> None:
    """A job in `error` holds no unique key, so a new job may take it. Retrying the old one
    then broke idx_job_queue_unique_key: a 500 from the job page, and from "Retry all
    matching" for every job in it. Now one retry is a 409 naming the cause, the bulk retry
    leaves such jobs out (and all but one of failed jobs sharing a key), and `jobs retry` says
    why."""
    a, _b, _ = await seed(pool)

    async def job(status: str, key: str) -> UUID:
        job_id: UUID = await pool.fetchval(
            "INSERT INTO job_queue (workspace_id, job_type, payload, status, unique_key)"
            " VALUES ($1, 'noop', '{}', $2::job_status, $3) RETURNING id",
            a,
            status,
            key,
        )
        return job_id

    held = await job("error", "k")
    await job("pending", "k")
    twins = [await job("error", "t"), await job("error", "t")]
    failed = await pool.fetchval(
        "SELECT count(*) FROM job_queue WHERE workspace_id = $1 AND status = 'error'", a
    )
    headers = {**workspace_bearer(db_url, a), **SAME_SITE}
    async with httpx.AsyncClient(base_url=admin, headers=headers) as http:
        csrf = await _csrf(http)
        one = await http.post(f"/admin/jobs/{held}/retry", data={"csrf": csrf})
        assert one.status_code == 409 and "unique key" in one.text, one.text
        bulk = await http.post("/admin/jobs/bulk-retry", data={"csrf": csrf, "status": "error"})
        assert bulk.status_code == 303, bulk.text
        assert f"retried={failed - 2}" in bulk.headers["location"], bulk.headers
    states = {
        r["id"]: r["status"]
        for r in await pool.fetch(
            "SELECT id, status::text FROM job_queue WHERE id = ANY($1)", [held, *twins]
        )
    }
    assert states[held] == "error"
    assert sorted(states[t] for t in twins) == ["error", "pending"]
    out = cli("jobs", "retry", str(held), url=db_url)
    assert out.returncode != 0 and "unique key" in out.stderr, out.stderr
    assert await pool.fetchval("SELECT status::text FROM job_queue WHERE id = $1", held) == "error"


async def test_the_workers_page_counts_a_worker_s_jobs_and_names_five(
    pool: asyncpg.Pool, db_url: str, admin: str
) -> None:
    """A worker holds up to its prefetch (thousands of short jobs): the page counts them and
    links the first five, and the other ids never leave the database."""
    a, _, _ = await seed(pool)
    worker_id = uuid4()
    await store.register_worker(pool, worker_id, "host-1", 4242, ["noop"], 60, "9.9.9", 7)
    await insert_jobs(pool, a, 1234, job_type_name="held")
    await pool.execute(
        "UPDATE job_queue SET status = 'running', worker_id = $1, started_at = now()"
        " WHERE job_type = 'held'",
        worker_id,
    )
    workers = await store.list_workers(pool)
    assert [(w["running_count"], len(w["running"])) for w in workers] == [(1234, 5)]
    platform = {"authorization": f"Bearer {token_for(db_url, '--all')}", **SAME_SITE}
    async with httpx.AsyncClient(base_url=admin, headers=platform) as http:
        page = (await http.get("/admin/workers")).text
    assert "<td>1234 " in page and page.count('href="/admin/jobs/') == 5


async def test_a_pause_or_job_action_does_what_it_names_or_nothing(
    pool: asyncpg.Pool, db_url: str, admin: str
) -> None:
    """A POST to /admin/pauses/ANYTHING other than pause resumed the type, and the overview
    said "ANYTHINGd."; a pause of a type paused already, or a resume of one not paused,
    changed nothing and said "paused." or "resumed.". A job action of an unknown name answered
    as if the job were in no state for it. An unknown action is now a 404 that changes
    nothing, and the overview says when a pause or resume changed nothing."""
    a, _b, _ = await seed(pool)
    job = await pool.fetchval("SELECT id FROM job_queue WHERE workspace_id = $1 LIMIT 1", a)
    platform = {"authorization": f"Bearer {token_for(db_url, '--all')}", **SAME_SITE}
    async with httpx.AsyncClient(base_url=admin, headers=platform) as http:
        csrf = await _csrf(http)

        async def post(path: str, reason: str) -> httpx.Response:
            form = {"csrf": csrf, "job_type": "srt_parse", "reason": reason}
            return await http.post(path, data=form)

        assert (await post("/admin/pauses/pause", "parser bug")).status_code == 303
        assert (await post("/admin/pauses/unpause", "x")).status_code == 404
        assert (await post("/admin/pauses/pause", "again")).headers["location"] == (
            "/admin?done=paused-already"
        )
        page = (await http.get("/admin?done=paused-already")).text
        assert "Nothing done: that job type was paused already" in page, page
        assert (await http.post(f"/admin/jobs/{job}/delete", data={"csrf": csrf})).status_code == (
            404
        )
        assert (await post("/admin/pauses/resume", "fixed")).headers["location"] == (
            "/admin?done=resume"
        )
        assert (await post("/admin/pauses/resume", "fixed")).headers["location"] == (
            "/admin?done=not-paused"
        )
        assert (
            "Nothing done: that job type was not paused"
            in (await http.get("/admin?done=not-paused")).text
        )
    audit = await pool.fetch("SELECT action, detail FROM admin_audit ORDER BY id")
    assert [(r["action"], r["detail"]["reason"]) for r in audit] == [
        ("pause", "parser bug"),
        ("resume", "fixed"),
    ]


async def test_the_job_page_cancels_a_waiting_job_and_says_what_a_cancel_did(
    pool: asyncpg.Pool, db_url: str, admin: str
) -> None:
    """A waiting job (a graph's child held by its parent) had no Cancel button, though a cancel
    takes it (`jobs cancel` does); and after Cancel on a running job, which its worker ends a
    moment later, the page showed it running with the Cancel button and not a word. A waiting
    job's page now cancels it, and a running job's says the cancel was requested, and when."""
    a, _b, _ = await seed(pool)
    parent, child = await new_jobs(pool, a, 2)
    await pool.execute(
        "INSERT INTO job_dependencies (parent_id, child_id) VALUES ($1, $2)", parent, child
    )
    worker = uuid4()
    await store.register_worker(pool, worker, "render-1", 1, ["noop"], 600)
    await pool.execute(
        "UPDATE job_queue SET status = 'running', worker_id = $1, attempts = 1 WHERE id = $2",
        worker,
        parent,
    )
    headers = {**workspace_bearer(db_url, a), **SAME_SITE}
    async with httpx.AsyncClient(base_url=admin, headers=headers, follow_redirects=True) as http:
        csrf = await _csrf(http)
        assert await pool.fetchval("SELECT status::text FROM job_queue WHERE id = $1", child) == (
            "waiting"
        )
        assert (
            f'action="/admin/jobs/{child}/cancel"' in (await http.get(f"/admin/jobs/{child}")).text
        )
        await http.post(f"/admin/jobs/{child}/cancel", data={"csrf": csrf})
        assert await pool.fetchval("SELECT status::text FROM job_queue WHERE id = $1", child) == (
            "cancelled"
        )
        page = (await http.post(f"/admin/jobs/{parent}/cancel", data={"csrf": csrf})).text
        assert 'id="job-status" data-status>running<' in page, page
        assert "Cancel requested: its worker is told and stops it" in page, page
        assert '<dd id="cancel-requested">' in page, page


async def test_a_bulk_retry_of_an_unknown_status_retries_nothing(
    pool: asyncpg.Pool, db_url: str, admin: str
) -> None:
    """A list reads an unknown status as all of them, and so did a bulk retry: status=erorr
    retried every failed and retrying job of the filter. A bulk retry of a status it does not
    know is now a 400 that retries nothing; the statuses the form sends still work."""
    a, _b, _ = await seed(pool)
    headers = workspace_bearer(db_url, a)
    async with httpx.AsyncClient(base_url=admin, headers=headers) as http:
        csrf = auth.csrf_for(headers["authorization"].removeprefix("Bearer "))
        refused = await http.post("/admin/jobs/bulk-retry", data={"csrf": csrf, "status": "erorr"})
        assert refused.status_code == 400, refused.text
        assert await pool.fetchval("SELECT count(*) FROM job_queue WHERE status = 'pending'") == 0
        sent = await http.post(
            "/admin/jobs/bulk-retry", data={"csrf": csrf, "status": "error", "type": "srt_parse"}
        )
        assert sent.status_code == 303 and "retried=2" in sent.headers["location"], sent.headers


async def test_a_pause_names_the_token_that_made_it_by_its_label(
    pool: asyncpg.Pool, db_url: str, admin: str
) -> None:
    """The pauses list's "By" showed `admin token <id>`, which says nothing to a reader: it
    shows the token's label (escaped), and the id once the token's row is gone."""
    await seed(pool)
    out = cli("admin-token", "create", "--all", "--label", "Kari <b>on call</b>", url=db_url)
    assert out.returncode == 0, out.stderr
    labelled = {"authorization": f"Bearer {out.stdout.strip()}", **SAME_SITE}
    token_id = await pool.fetchval("SELECT id FROM admin_tokens WHERE label LIKE 'Kari%'")
    async with httpx.AsyncClient(base_url=admin, headers=labelled) as http:
        form = {"csrf": await _csrf(http), "job_type": "srt_parse", "reason": "parser bug"}
        assert (await http.post("/admin/pauses/pause", data=form)).status_code == 303
        page = (await http.get("/admin")).text
    by = _pause_by(page, "srt_parse")
    assert html.unescape(by) == "Kari <b>on call</b>" and "<b>" not in by, by
    await pool.execute("DELETE FROM admin_tokens WHERE id = $1", token_id)
    other = {"authorization": f"Bearer {token_for(db_url, '--all')}", **SAME_SITE}
    async with httpx.AsyncClient(base_url=admin, headers=other) as http:
        page = (await http.get("/admin")).text
    assert html.unescape(_pause_by(page, "srt_parse")) == f"admin token {token_id}"


def _pause_by(page: str, job_type: str) -> str:
    """The "By" cell of a pause's row on the overview, as HTML."""
    table = page.split('id="pauses"', 1)[1].split("</table>", 1)[0]
    row = table.split(f'<td class="text">{job_type}</td>', 1)[1].split("</tr>", 1)[0]
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
    return cells[1]


async def test_a_pause_of_a_type_nobody_knows_is_refused(
    pool: asyncpg.Pool, db_url: str, admin: str
) -> None:
    """A hand-made POST paused any name (a typo paused nothing and said "paused."): a pause
    takes a job type this installation runs, or one that jobs in the queue have (a plain-SQL
    writer's); any other is a 400 that says why and pauses nothing. A resume takes any paused
    name, so a pause SQL made of another name can still be lifted."""
    a, _b, _ = await seed(pool)
    await insert_jobs(pool, a, 1, job_type_name="legacy_import")
    await pool.execute(
        "INSERT INTO job_type_pauses (job_type, paused_by, reason) VALUES ('ghost', 'ops', 'x')"
    )
    platform = {"authorization": f"Bearer {token_for(db_url, '--all')}", **SAME_SITE}
    async with httpx.AsyncClient(base_url=admin, headers=platform) as http:
        csrf = await _csrf(http)

        async def post(action: str, job_type: str) -> httpx.Response:
            form = {"csrf": csrf, "job_type": job_type, "reason": "why"}
            return await http.post(f"/admin/pauses/{action}", data=form)

        for name in ("srt_prase", "<b>nope</b>"):
            refused = await post("pause", name)
            assert refused.status_code == 400, refused.text
            assert f"unknown job type {name!r}" in refused.text, refused.text
            assert "srt_parse" in refused.text  # the known ones are named
        for name in ("whisper_transcribe", "legacy_import"):  # no job / not registered
            assert (await post("pause", name)).status_code == 303, name
        assert (await post("resume", "ghost")).status_code == 303
    paused = await pool.fetch("SELECT job_type FROM job_type_pauses ORDER BY 1")
    assert [r["job_type"] for r in paused] == ["legacy_import", "whisper_transcribe"]


async def test_a_platform_retry_follows_no_cancelled_by_into_another_workspace(
    pool: asyncpg.Pool, db_url: str, admin: str
) -> None:
    """A retry of a job a parent's failure cancelled puts back the failed ancestor its
    `cancelled_by` names, a column any writer of the row may set. A platform operator's retry
    of workspace A's job naming workspace B's failed job put B's job back (its paid calls ran
    again). The walk stays in the job's workspace: nothing is retried, B's job stays failed."""
    a, b, _ = await seed(pool)
    theirs = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload, status, completed_at)"
        " VALUES ($1, 'noop', '{}', 'error', now()) RETURNING id",
        b,
    )
    forged = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload, status, cancelled_by,"
        " completed_at) VALUES ($1, 'noop', '{}', 'cancelled', $2, now()) RETURNING id",
        a,
        theirs,
    )
    platform = {"authorization": f"Bearer {token_for(db_url, '--all')}", **SAME_SITE}
    async with httpx.AsyncClient(base_url=admin, headers=platform) as http:
        csrf = await _csrf(http)
        sent = await http.post(f"/admin/jobs/{forged}/retry", data={"csrf": csrf})
        assert sent.status_code < 500, sent.text
    assert (
        await pool.fetchval("SELECT status::text FROM job_queue WHERE id = $1", theirs) == "error"
    )
