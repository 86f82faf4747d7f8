"""Rows a plain-SQL writer makes or changes under the worker: a running job set back to
pending, rows set running under a live worker, relatives whose types are megabytes, a priority
at smallint's bottom, a running row without its start. Whatever the rows say, the worker keeps
running every other job."""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import pytest

from sidelinja_worker.queue import store
from sidelinja_worker.queue.context import JobContext
from sidelinja_worker.queue.db import init_connection
from sidelinja_worker.queue.registry import Registry
from sidelinja_worker.queue.settings import WorkerSettings
from sidelinja_worker.queue.worker import Worker
from tests.helpers import (
    cli,
    insert_jobs,
    job_type,
    make_workspace,
    run_burst,
    running_worker,
    statuses,
    wait_for,
)


async def test_a_running_job_set_back_to_pending_runs_once_here_and_the_worker_lives_on(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """The web app sets a running job back to `pending` (its worker_id still this worker's),
    and this worker claims it again while its first run goes on. Two runs of one job in one
    worker shared the job's entries in the worker's tables: the second to end found them gone
    (KeyError), its slot died, and with it the worker (exit 3), every job it held handed to the
    rescue. The row is this worker's and its run is under way: the second claim is that run."""
    release = asyncio.Event()
    runs: list[UUID] = []

    async def long(ctx: JobContext, payload: Any) -> dict[str, int]:
        runs.append(ctx.job_id)
        await release.wait()
        return {"run": len(runs)}

    job = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload) VALUES ($1, 'long', '{}')"
        " RETURNING id",
        workspace,
    )
    worker = Worker(
        pool,
        db_url,
        Registry([job_type("long", long)]),
        WorkerSettings(poll_interval_s=0.05, max_concurrent=3, burst=True),
    )
    task = asyncio.create_task(worker.run())
    await wait_for(lambda: runs, what="the first run")
    await pool.execute("UPDATE job_queue SET status = 'pending' WHERE id = $1", job)
    await wait_for(
        lambda: pool.fetchval(
            "SELECT status = 'running' AND attempts = 2 FROM job_queue WHERE id = $1", job
        ),
        what="the second claim",
    )
    await wait_for(lambda: worker.claims_made >= 3, what="a claim after the second")
    release.set()
    await asyncio.wait_for(task, 30)  # raised WorkerDied before
    row = await pool.fetchrow("SELECT status::text, attempts FROM job_queue WHERE id = $1", job)
    assert (row["status"], row["attempts"]) == ("completed", 2)
    assert runs == [job]


async def join_of_parents(
    pool: asyncpg.Pool, workspace: UUID, parents: int, parent_type_sql: str
) -> UUID:
    """A pending job of type `join` whose parents are `parents` completed jobs, each of the
    type the SQL expression `parent_type_sql` gives, with the result `{}`."""
    return await pool.fetchval(
        "WITH parents AS (INSERT INTO job_queue (workspace_id, job_type, payload, status,"
        f"   result, created_at) SELECT $1, {parent_type_sql}, '{{}}', 'completed', '{{}}',"
        "   now() - interval '1 s' FROM generate_series(1, $2) RETURNING id),"
        " joined AS (INSERT INTO job_queue (workspace_id, job_type, payload)"
        "   VALUES ($1, 'join', '{}') RETURNING id),"
        " edges AS (INSERT INTO job_dependencies (parent_id, child_id)"
        "   SELECT p.id, j.id FROM parents p, joined j)"
        " SELECT id FROM joined",
        workspace,
        parents,
    )


async def test_relatives_with_types_of_megabytes_are_read_within_the_joins_cap(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """A job's parents and children are any rows a plain-SQL writer joins to it, their
    `job_type` text of any length (stored compressed, a few kilobytes each). A join read its
    parents' types whole beside their results, which are capped, and `ctx.children()` its
    children's: 40 relatives of 2 MB each brought 80 MB to the worker, past the 64 MiB a join
    may read; thousands would take its memory, and the rescue would hand the job on to the next
    worker. No job type is that long: a relative's type comes as its first 200 characters."""
    seen: dict[str, int] = {}

    async def join(ctx: JobContext, payload: Any) -> None:
        seen["parents"] = sum(len(p.job_type) for p in await ctx.parent_results())
        seen["children"] = sum(len(t) for _, t, _ in await ctx.children())

    child = await join_of_parents(pool, workspace, 40, "repeat('p', 2000000)")
    await pool.execute(
        "WITH children AS (INSERT INTO job_queue (workspace_id, job_type, payload,"
        "   created_at) SELECT $1, repeat('c', 2000000), '{}', now() + interval '1 s'"
        "   FROM generate_series(1, 40) RETURNING id)"
        " INSERT INTO job_dependencies (parent_id, child_id) SELECT $2, id FROM children",
        workspace,
        child,
    )
    await run_burst(pool, db_url, Registry([job_type("join", join)]))
    assert seen == {"parents": 40 * 200, "children": 40 * 200}


@pytest.mark.parametrize("capped", [False, True])
async def test_a_job_at_the_lowest_priority_never_stops_the_fair_claims(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, capped: bool
) -> None:
    """The fair claims (the default) compare each candidate with the first job they leave out
    of a full share by the negated priority, and smallint's lowest, -32768, has no negation in
    smallint: one such row among the candidates beside a busy workspace failed every fair
    claim of every worker ("smallint out of range"), and the claim loop, which retries only a
    lost connection, ended the worker (exit 3), and its restart, for as long as the row was
    due. The whole queue stopped for one row of one workspace."""
    other = await make_workspace(pool, "other")
    if capped:
        await pool.execute(
            "INSERT INTO job_type_limits (job_type, max_running) VALUES ('noop', 50)"
        )
    await insert_jobs(pool, workspace, 100)
    lowest = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload, priority)"
        " VALUES ($1, 'noop', '{}', -32768) RETURNING id",
        other,
    )
    await run_burst(pool, db_url)  # raised WorkerDied before
    assert await statuses(pool) == {"completed": 101}
    assert await pool.fetchval("SELECT status::text FROM job_queue WHERE id = $1", lowest) == (
        "completed"
    )


async def test_jobs_why_explains_a_running_row_plain_sql_left_without_a_start(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """`started_at` is the claim's, but any writer may set a row `running` without one (or
    with one no datetime holds): `jobs why` ended in a traceback (None has no date format)."""
    for started in ("NULL", "'infinity'"):
        job = await pool.fetchval(
            "INSERT INTO job_queue (workspace_id, job_type, payload, status, started_at)"
            f" VALUES ($1, 'noop', '{{}}', 'running', {started}) RETURNING id",
            workspace,
        )
        out = await asyncio.to_thread(cli, "jobs", "why", str(job), url=db_url)
        assert out.returncode == 0, out.stderr
        assert "it is running" in out.stdout


async def test_rows_set_running_under_a_live_worker_by_the_hundred_thousand_are_given_back(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """Any writer of job_queue (the web app's role too: it reads job_workers) may set its rows
    `running` under a live worker's id. The worker gives back the rows it holds but never got
    at each heartbeat: it read every such row, then released them in one statement, under the
    claim lock and before its next heartbeat. 400,000 of them: the release outlasted its 10 s
    bound at every heartbeat, so none came back, each holding a place in its type's cap for as
    long as the worker lived, and the heartbeat waited for it past the lease, so the worker was
    declared dead. They are given back in batches, a bounded time per heartbeat."""
    async with running_worker(
        pool, db_url, Registry([job_type("quick", _quick)]), lease_s=3.0, poll_interval_s=0.5
    ) as worker:
        first_id = worker.id
        await wait_for(
            lambda: pool.fetchval("SELECT count(*) = 1 FROM job_workers WHERE id = $1", first_id)
        )
        await pool.execute(
            "INSERT INTO job_queue (workspace_id, job_type, payload, status, worker_id, attempts,"
            " started_at) SELECT $1, 'parked', '{}', 'running', $2, 1, now()"
            " FROM generate_series(1, 400000)",
            workspace,
            first_id,
        )
        await wait_for(
            lambda: pool.fetchval(
                "SELECT count(*) >= 100000 FROM job_queue WHERE status = 'pending'"
            ),
            timeout_s=60,
            what="a quarter of the rows given back",
        )
        assert worker.id == first_id and not worker._fatal  # never declared dead
        await pool.execute("DELETE FROM job_queue WHERE status = 'running'")


# Each statement on a pool made by _short_statements is cut off by the server after this long:
# the give-backs below took 3.3-4.0 s (release_held), 4.5-6.6 s (abandon_worker) and 5.6-7.9 s
# (the rescue) for 200,000 rows in one statement on 2 busy cores, and take 50-230 ms a batch.
SHORT_STATEMENT_MS = 1000
FORGED = 200_000


async def _short_statements(db_url: str) -> asyncpg.Pool:
    return await asyncpg.create_pool(
        db_url,
        min_size=1,
        max_size=2,
        init=init_connection,
        server_settings={"statement_timeout": str(SHORT_STATEMENT_MS)},
    )


async def _forge_running(
    pool: asyncpg.Pool, workspace: UUID, worker_id: UUID, n: int, *, expires: str
) -> None:
    """A worker row expiring at `expires` (SQL) and `n` rows set running under it by plain SQL,
    at their second of three attempts."""
    await pool.execute(
        "INSERT INTO job_workers (id, hostname, pid, expires_at)"
        f" VALUES ($1, 'forged', 1, {expires})",
        worker_id,
    )
    await pool.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload, status, worker_id, attempts,"
        " started_at) SELECT $1, 'parked', '{}', 'running', $2, 2, now()"
        " FROM generate_series(1, $3)",
        workspace,
        worker_id,
        n,
    )


async def test_a_dead_worker_s_rows_by_the_hundred_thousand_are_rescued_in_short_statements(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """Any writer may set rows running under a worker's id by the hundred thousand. The rescue
    put back every dead worker's jobs in one statement: 200,000 of them took 6 to 8 s, some
    250,000 outlast its 10 s timeout, which then grew at every try while every worker ran the
    same statement, and no dead worker's job came back meanwhile. Here the server cuts off any
    statement past 1 s: the rescue still brings them all back, and leaves a renewing worker's
    jobs and a just-started orphan alone."""
    dead, live, gone = uuid4(), uuid4(), uuid4()
    await _forge_running(pool, workspace, dead, FORGED, expires="now() - interval '1 minute'")
    await _forge_running(pool, workspace, live, 3, expires="now() + interval '1 hour'")
    await pool.execute(  # claimed by a worker a moment ago, its row not yet seen
        "INSERT INTO job_queue (workspace_id, job_type, payload, status, worker_id, attempts,"
        " started_at) VALUES ($1, 'parked', '{}', 'running', $2, 1, now())",
        workspace,
        gone,
    )
    short = await _short_statements(db_url)
    try:
        rescued = await store.rescue(short, 60)
    finally:
        await short.close()
    assert len(rescued) == len(set(rescued)) == FORGED
    rows = await pool.fetch(
        "SELECT worker_id, status::text, attempts, count(*) FROM job_queue GROUP BY 1, 2, 3"
    )
    assert {(r[0], r[1], r[2], r[3]) for r in rows} == {
        (None, "retry", 2, FORGED),
        (live, "running", 2, 3),
        (gone, "running", 1, 1),
    }
    assert await pool.fetchval("SELECT array_agg(id) FROM job_workers") == [live]


async def test_a_worker_s_exit_gives_back_its_rows_by_the_hundred_thousand_in_short_statements(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """At exit a worker gives back every row still running under it (release_held), and one
    whose internal task died hands them on, each an attempt (abandon_worker): each did all of
    them in one statement, 4 s and 6 s for 200,000 forged rows: past its 10 s timeout, at some
    500,000 and 330,000, none came back. The server here cuts off any statement past 1 s."""
    held, abandoned = uuid4(), uuid4()
    for worker_id in (held, abandoned):
        await _forge_running(
            pool, workspace, worker_id, FORGED, expires="now() + interval '1 hour'"
        )
    short = await _short_statements(db_url)
    try:
        assert len(set(await store.release_held(short, held))) == FORGED
        assert (
            len(set(await store.abandon_worker(short, abandoned, "its claim loop died"))) == FORGED
        )
    finally:
        await short.close()
    rows = await pool.fetch(
        "SELECT status::text, attempts, error_msg, count(*) FROM job_queue GROUP BY 1, 2, 3"
    )
    assert {(r[0], r[1], r[2], r[3]) for r in rows} == {
        ("retry", 1, None, FORGED),
        ("retry", 2, f"abandoned by worker {abandoned}: its claim loop died", FORGED),
    }


async def _quick(ctx: JobContext, payload: Any) -> None:
    return None


async def test_a_job_of_a_hundred_thousand_children_reads_a_thousand(
    pool: asyncpg.Pool, workspace: UUID
) -> None:
    """Any writer may give a job children by the hundred thousand (rows of job_dependencies in
    its workspace): `ctx.children()`, which whisper_transcribe asked whether it had an
    srt_parse child, read every one of them, and `jobs show` printed them all. A thousand of
    each relation are read, unfinished first, the rest counted; whisper asks the one question."""
    parent = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload) VALUES ($1, 'noop', '{}')"
        " RETURNING id",
        workspace,
    )
    await pool.execute(
        "WITH kids AS (INSERT INTO job_queue (workspace_id, job_type, payload, created_at)"
        "  SELECT $1, CASE WHEN i = 100000 THEN 'srt_parse' ELSE 'noop' END, '{}',"
        "         now() + interval '1 second'"
        "  FROM generate_series(1, 100000) AS i RETURNING id)"
        " INSERT INTO job_dependencies (parent_id, child_id) SELECT $2, id FROM kids",
        workspace,
        parent,
    )
    rows = await store.job_relatives(pool, parent)
    children = [r for r in rows if r["relation"] == "child"]
    assert (len(children), children[0]["more"]) == (store.MAX_RELATIVES, 99_000)
    assert await store.has_child(pool, parent, "srt_parse")
    assert not await store.has_child(pool, parent, "whisper_transcribe")


async def test_a_join_of_a_hundred_thousand_parents_fails_without_reading_them(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """`ctx.parent_results()` read every parent (its results within the 64 MiB cap, but a row
    per parent however many): 100,000 parents with no result came back whole. A handler reads
    at most as many parents as a join of its own may have; more fails the job, naming them."""
    read: list[int] = []

    async def join(ctx: JobContext, payload: Any) -> None:
        read.append(len(await ctx.parent_results()))

    joined = await join_of_parents(pool, workspace, 100_000, "'done'")
    await run_burst(pool, db_url, Registry([job_type("join", join)]))
    row = await store.get_job(pool, joined)
    assert (row["status"], read) == ("error", []), row["error_msg"]
    assert row["error_msg"] == "this job has 100,000 parents, over the 10,000 a handler reads"
