"""Job graphs: dependencies declared in plain SQL, failure rules, results along edges."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import pytest

from sidelinja_worker.jobs import noop
from sidelinja_worker.queue import context, maintenance, migrate, store
from sidelinja_worker.queue.client import NewJob, enqueue_many
from sidelinja_worker.queue.config import ServiceConfig
from sidelinja_worker.queue.context import MAX_FOLLOW_UPS, JobContext
from sidelinja_worker.queue.ids import uuid7s
from sidelinja_worker.queue.queries import QUERIES
from sidelinja_worker.queue.registry import Registry
from tests.fakes.ai_gateway_server import FakeAiGateway, ai_gateway_fixture  # noqa: F401
from tests.fakes.fixtures import (  # noqa: F401  (pytest finds fixtures by module name)
    forgejo_fake_fixture,
    media_root_fixture,
    service_config,
    whisper_fake_fixture,
)
from tests.fakes.forgejo_server import FakeForgejo
from tests.fakes.whisper_server import FakeWhisper
from tests.helpers import (
    chain,
    cli,
    insert_jobs,
    job_type,
    rows_read,
    run_burst,
    spawn,
    statuses,
    wait_for,
)

PSQL = "/usr/bin/psql"


async def wait_until(check: Callable[[], Awaitable[Any]], timeout_s: float = 60) -> None:
    async with asyncio.timeout(timeout_s):
        while not await check():
            await asyncio.sleep(0.05)


async def by_name(pool: asyncpg.Pool) -> dict[str, asyncpg.Record]:
    rows = await pool.fetch("SELECT *, status::text AS st FROM job_queue")
    return {r["payload"]["name"]: r for r in rows if "name" in r["payload"]}


def psql(url: str, sql: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PSQL, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", url, "-c", sql],
        capture_output=True,
        text=True,
        timeout=60,
    )


def graph_sql(
    workspace: UUID, names: list[str], edges: list[tuple[str, str]], **payload: Any
) -> str:
    """One INSERT statement: jobs named `names` (in their payload) and the edges between them."""
    rows = ", ".join(
        f"('{workspace}', 'noop', '{json.dumps({'name': n, **payload.get(n, {})})}')" for n in names
    )
    pairs = ", ".join(f"('{p}', '{c}')" for p, c in edges)
    return (
        f"WITH jobs AS (INSERT INTO job_queue (workspace_id, job_type, payload) VALUES {rows}"
        " RETURNING id, payload->>'name' AS name) "
        "INSERT INTO job_dependencies (parent_id, child_id) "
        f"SELECT p.id, c.id FROM (VALUES {pairs}) AS e(parent, child) "
        "JOIN jobs p ON p.name = e.parent JOIN jobs c ON c.name = e.child"
    )


async def test_a_graph_inserted_by_psql_runs_in_order(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    # A diamond: a -> {b, c} -> d, one statement from a client that is not Python.
    sql = graph_sql(
        workspace, ["a", "b", "c", "d"], [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")]
    )
    done = psql(db_url, sql)
    assert done.returncode == 0, done.stderr
    jobs = await by_name(pool)
    assert {n: j["st"] for n, j in jobs.items()} == {
        "a": "pending",
        "b": "waiting",
        "c": "waiting",
        "d": "waiting",
    }
    await run_burst(pool, db_url)
    jobs = await by_name(pool)
    assert {j["st"] for j in jobs.values()} == {"completed"}
    for parent, child in [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")]:
        assert jobs[parent]["completed_at"] <= jobs[child]["started_at"]


async def test_a_released_child_wakes_the_workers(pool: asyncpg.Pool, workspace: UUID) -> None:
    # The child becomes due in the parent's completion and PostgreSQL notifies the workers: no
    # poll interval passes before it runs.
    conn = await pool.acquire()
    try:
        got: asyncio.Queue[str] = asyncio.Queue()

        def heard(*args: Any) -> None:
            got.put_nowait(args[2])

        await conn.add_listener("sidelinja_job_due", heard)
        await pool.execute(graph_sql(workspace, ["p", "c"], [("p", "c")]))
        await asyncio.wait_for(got.get(), 5)  # the insert's own notification
        await pool.execute("UPDATE job_queue SET status = 'completed' WHERE payload->>'name' = 'p'")
        await asyncio.wait_for(got.get(), 5)
        assert (await by_name(pool))["c"]["st"] == "pending"
    finally:
        await conn.remove_listener("sidelinja_job_due", heard)
        await pool.release(conn)


async def test_no_self_dependency_later_parent_or_cycle(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    await pool.execute(graph_sql(workspace, ["x", "y"], [("x", "y")]))
    later = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload)"
        " VALUES ($1, 'noop', '{\"name\": \"later\"}') RETURNING id",
        workspace,
    )
    jobs = await by_name(pool)
    with pytest.raises(asyncpg.CheckViolationError):
        await pool.execute(
            "INSERT INTO job_dependencies (parent_id, child_id) VALUES ($1, $1)", jobs["x"]["id"]
        )
    with pytest.raises(asyncpg.CheckViolationError, match="created after it"):
        await pool.execute(
            "INSERT INTO job_dependencies (parent_id, child_id) VALUES ($1, $2)",
            later,
            jobs["x"]["id"],
        )
    # Jobs made in one transaction share created_at: a cycle among them is refused too, by
    # psql as by anyone.
    done = psql(
        db_url, graph_sql(workspace, ["c1", "c2", "c3"], [("c1", "c2"), ("c2", "c3"), ("c3", "c1")])
    )
    assert done.returncode != 0 and "cycle" in done.stderr, done.stderr
    assert "c1" not in await by_name(pool)
    with pytest.raises(asyncpg.CheckViolationError, match="cycle"):
        await pool.execute(
            "INSERT INTO job_dependencies (parent_id, child_id) VALUES ($1, $2)",
            jobs["y"]["id"],
            jobs["x"]["id"],
        )


async def noop_jobs(conn: asyncpg.Connection, workspace: UUID, n: int) -> list[UUID]:
    """`n` noop jobs made in one statement, so at one instant (they share created_at)."""
    rows = await conn.fetch(
        "INSERT INTO job_queue (workspace_id, job_type, payload)"
        " SELECT $1, 'noop', '{}' FROM generate_series(1, $2) RETURNING id",
        workspace,
        n,
    )
    return [r["id"] for r in rows]


async def completed_a_minute_ago(pool: asyncpg.Pool, workspace: UUID, result: str) -> UUID:
    """A completed noop job with `result` (JSON), created before any job a test adds next."""
    job: UUID = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload, status, result, completed_at,"
        " created_at) VALUES ($1, 'noop', '{}', 'completed', $2, now(),"
        " now() - interval '1 minute') RETURNING id",
        workspace,
        result,
    )
    return job


async def add_chain(conn: asyncpg.Connection, ids: list[UUID]) -> None:
    """The edges of a chain through `ids`, in one statement."""
    await conn.execute(
        "INSERT INTO job_dependencies (parent_id, child_id)"
        " SELECT a, b FROM unnest($1::uuid[], $2::uuid[]) AS e(a, b)",
        ids[:-1],
        ids[1:],
    )


@pytest.mark.parametrize("order", ["from its end up", "from its head down", "in one statement"])
async def test_a_graph_built_one_edge_per_statement_costs_each_edge_alike(
    pool: asyncpg.Pool, workspace: UUID, order: str
) -> None:
    """The edges of a chain of jobs made in one transaction, inserted one per statement as an
    ORM writes them, or all in one (as the client does). The cycle check walked everything below each new child, a level at a time,
    and the planner, taking a walk for a handful of rows, joined every level to the whole edge
    table; the settle scanned the waiting index and every edge per job too: from its end up,
    1,000 jobs took 82 s under the lock every edge insert waits for in a new database, and 400
    read 724,000 rows here; in one statement each edge walked the rest of the chain below it
    (5,000 jobs: 15 s here, now 1 s).
    Now each edge reads about as many rows, however long the chain (~25 here)."""
    depth = 5_000 if order == "in one statement" else 400
    # A database with a history, analyzed: the planner knows both tables are big.
    await pool.execute(
        "WITH done AS (INSERT INTO job_queue (workspace_id, job_type, payload, status,"
        " completed_at) SELECT $1, 'noop', '{}', 'completed', now()"
        " FROM generate_series(1, 20000) RETURNING id)"
        " INSERT INTO job_dependencies (parent_id, child_id)"
        " SELECT p, c FROM (SELECT id AS c, lag(id) OVER (ORDER BY id) AS p,"
        " row_number() OVER (ORDER BY id) AS n FROM done) e WHERE n % 2 = 0",
        workspace,
    )
    await pool.execute("ANALYZE job_queue; ANALYZE job_dependencies")
    async with pool.acquire() as conn, conn.transaction():
        ids = await noop_jobs(conn, workspace, depth)
        before = await rows_read(conn)
        started = time.perf_counter()
        if order == "in one statement":
            await add_chain(conn, ids)
        steps = {"from its end up": range(depth - 1, 0, -1), "from its head down": range(1, depth)}
        for i in steps.get(order, ()):
            await conn.execute(
                "INSERT INTO job_dependencies (parent_id, child_id) VALUES ($1, $2)",
                ids[i - 1],
                ids[i],
            )
        elapsed_s = time.perf_counter() - started
        read = await rows_read(conn) - before
        if order == "in one statement":
            # Such a statement may join its edges to job_queue by hashing, reading it whole a
            # few times, and the walk it replaces read few rows per step but took a step per
            # pair of jobs on the chain (5,000 jobs: 12.5 million): time tells them apart.
            assert read < 60 * depth + 10 * (20_000 + depth), read
            assert elapsed_s < 4.0, elapsed_s
        else:
            assert read < 60 * depth, read
        statuses_now = await conn.fetch(
            "SELECT status::text AS st, count(*) AS n FROM job_queue GROUP BY 1"
        )
        assert {r["st"]: r["n"] for r in statuses_now} == {
            "completed": 20000,
            "pending": 1,
            "waiting": depth - 1,
        }
        # And the cycle the chain would close is still refused.
        with pytest.raises(asyncpg.CheckViolationError, match="cycle"):
            async with conn.transaction():
                await conn.execute(
                    "INSERT INTO job_dependencies (parent_id, child_id) VALUES ($1, $2)",
                    ids[-1],
                    ids[0],
                )


async def test_the_cycle_check_looks_far_enough_both_ways(
    pool: asyncpg.Pool, workspace: UUID
) -> None:
    """The check stops walking at a bound that grows; a cycle whose two sides are both longer
    than the first bounds is still found, an edge beside one is still let in, and in one
    statement with edges of two transactions' graphs each is judged within its own."""

    async def graph_chain(n: int) -> list[UUID]:
        async with pool.acquire() as conn, conn.transaction():
            ids = await noop_jobs(conn, workspace, n)
            await add_chain(conn, ids)
        return ids

    def edges(*pairs: tuple[UUID, UUID]) -> str:
        rows = ", ".join(f"('{p}'::uuid, '{c}'::uuid)" for p, c in pairs)
        return f"INSERT INTO job_dependencies (parent_id, child_id) VALUES {rows}"

    a, b = await graph_chain(300), await graph_chain(300)
    # Within a: 150 jobs above the new edge's parent, 150 below its child.
    with pytest.raises(asyncpg.CheckViolationError, match="cycle"):
        await pool.execute(edges((a[150], a[10])))
    with pytest.raises(asyncpg.CheckViolationError, match="cycle"):
        await pool.execute(edges((a[-1], a[0])))
    # A shortcut within a is no cycle; nor is an edge between a's and b's jobs (b is newer).
    await pool.execute(edges((a[10], a[150])))
    await pool.execute(edges((a[-1], b[0])))
    # Each of a's and b's edges in one statement: a's is fine, b's closes a cycle within b.
    with pytest.raises(asyncpg.CheckViolationError, match="cycle"):
        await pool.execute(edges((a[20], a[200]), (b[250], b[5])))
    # Two chains of one transaction, and two new edges that close a cycle only together.
    two = await graph_chain(200)
    await pool.execute("DELETE FROM job_dependencies WHERE parent_id = $1", two[99])
    with pytest.raises(asyncpg.CheckViolationError, match="cycle"):
        await pool.execute(edges((two[199], two[0]), (two[99], two[100])))
    await pool.execute(edges((two[199], two[0])))
    assert (
        await pool.fetchval("SELECT count(*) FROM job_dependencies WHERE parent_id = $1", two[99])
        == 0
    )


@pytest.mark.parametrize("made_before", [False, True], ids=["no table yet", "table made"])
async def test_a_role_that_may_not_make_temporary_tables_still_has_its_cycles_refused(
    db_url: str, pool: asyncpg.Pool, workspace: UUID, made_before: bool
) -> None:
    """The check peels the jobs on a statement's paths in a temporary table: a role without
    TEMPORARY on the database gets the walk per edge instead, and the same answers; and in a
    session whose table another role made first (a pooler's login role, then SET ROLE), the
    next role uses that table."""
    role = f"sw_test_no_temp_{uuid4().hex[:12]}"
    database = await pool.fetchval("SELECT current_database()")
    await pool.execute(f"CREATE ROLE {role} NOLOGIN")
    conn = await asyncpg.connect(db_url)
    try:
        await pool.execute(f'REVOKE TEMPORARY ON DATABASE "{database}" FROM PUBLIC')
        await pool.execute(f"GRANT sidelinja_app TO {role}")
        if made_before:
            async with conn.transaction():
                await add_chain(conn, await noop_jobs(conn, workspace, 3))
        made = "SELECT to_regclass('pg_temp.sidelinja_cycle_jobs') IS NOT NULL"
        assert await conn.fetchval(made) == made_before
        for cycle in (False, True):
            with contextlib.suppress(asyncpg.CheckViolationError):
                async with conn.transaction():
                    await conn.execute(f"SET LOCAL ROLE {role}")
                    await conn.execute(
                        "SELECT set_config('sidelinja.workspace_id', $1, true)", str(workspace)
                    )
                    ids = await noop_jobs(conn, workspace, 50)
                    await add_chain(conn, ids + ids[:1] if cycle else ids)
                    assert not cycle, "a cycle went in"
        edges = await pool.fetchval("SELECT count(*) FROM job_dependencies")
        assert edges == 49 + (2 if made_before else 0)
    finally:
        await conn.close()
        await pool.execute(f"DROP OWNED BY {role}")
        await pool.execute(f"DROP ROLE {role}")


async def test_failure_cancels_descendants_and_retry_resumes(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    # a fails for good; b depends on a, c on b; "cleanup" runs anyway.
    sql = graph_sql(
        workspace,
        ["a", "b", "c", "cleanup"],
        [("a", "b"), ("b", "c")],
        a={"fail_permanent": "disk full"},
    )
    await pool.execute(sql)
    await pool.execute(
        "INSERT INTO job_dependencies (parent_id, child_id, run_anyway)"
        " SELECT p.id, c.id, true FROM job_queue p, job_queue c"
        " WHERE p.payload->>'name' = 'a' AND c.payload->>'name' = 'cleanup'"
    )
    await run_burst(pool, db_url)
    jobs = await by_name(pool)
    a = jobs["a"]
    assert a["st"] == "error"
    assert jobs["b"]["st"] == "cancelled"
    assert jobs["b"]["error_msg"] == f"parent {a['id']} (noop) ended in error: disk full"
    assert jobs["c"]["st"] == "cancelled"
    assert str(jobs["b"]["id"]) in jobs["c"]["error_msg"]
    assert jobs["cleanup"]["st"] == "completed"

    # The retry, with the fault fixed: a plain-SQL UPDATE brings the graph back.
    await pool.execute(
        "UPDATE job_queue SET status = 'pending', payload = payload - 'fail_permanent',"
        " attempts = 0, scheduled_for = now() WHERE id = $1",
        a["id"],
    )
    jobs = await by_name(pool)
    assert (jobs["b"]["st"], jobs["c"]["st"]) == ("waiting", "waiting")
    assert jobs["b"]["error_msg"] is None
    await run_burst(pool, db_url)
    assert {j["st"] for j in (await by_name(pool)).values()} == {"completed"}


async def test_a_chain_hundreds_deep_is_cancelled_whole_by_a_failure_or_a_rescue(
    pool: asyncpg.Pool, workspace: UUID
) -> None:
    """A settle followed a failure down the graph one nested statement per level, and a chain
    a few hundred deep ran out of PostgreSQL's stack: its head's failure could never be written
    (the job went back to the queue and ran again, for ever), and the rescue, one statement for
    every dead worker's jobs, failed for all of them."""
    depth = 500
    failed, rescued = await chain(pool, workspace, depth), await chain(pool, workspace, depth)
    plain = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload) VALUES ($1, 'noop', '{}')"
        " RETURNING id",
        workspace,
    )
    worker_id = UUID(int=5)
    await store.register_worker(pool, worker_id, "test", 1, None, 60)
    held = {j.id for j in await store.claim(pool, worker_id, 10, None)}
    assert held == {failed[0], rescued[0], plain}
    await store.fail(pool, worker_id, [store.Failure(failed[0], "permanent", "no", True, 0.0)])
    # The worker dies on the last attempt of the other head (and with a job outside graphs).
    await pool.execute("UPDATE job_queue SET max_attempts = 1 WHERE id = $1", rescued[0])
    await pool.execute("UPDATE job_workers SET expires_at = now() - interval '1 minute'")
    assert set(await store.rescue(pool, 60)) == {rescued[0], plain}

    rows = {
        r["id"]: r
        for r in await pool.fetch("SELECT id, status::text AS st, cancelled_by FROM job_queue")
    }
    assert rows[plain]["st"] == "retry"
    for ids in (failed, rescued):
        assert rows[ids[0]]["st"] == "error"
        assert [(rows[i]["st"], rows[i]["cancelled_by"]) for i in ids[1:]] == [
            ("cancelled", parent) for parent in ids[:-1]
        ]
    # A retry of the head brings the whole chain back, as deep as it goes.
    await pool.execute("UPDATE job_queue SET status = 'pending' WHERE id = $1", failed[0])
    back = await pool.fetch(
        "SELECT status::text AS st, count(*) AS n FROM job_queue WHERE id = ANY($1) GROUP BY 1",
        failed[1:],
    )
    assert {r["st"]: r["n"] for r in back} == {"waiting": depth - 1}


async def test_a_waiting_job_holds_its_unique_key(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """A job held by its parents (`waiting`) was outside the unique index, so a second job with
    its key went in beside it, by plain SQL or the client's dedupe. When the parent completed,
    releasing the first to `pending` broke the index and the parent's completion was refused:
    the parent ended in `error`, its result lost, and its child was cancelled."""
    parent, child = (
        r["id"]
        for r in await pool.fetch(
            "WITH jobs AS (INSERT INTO job_queue (workspace_id, job_type, payload, unique_key)"
            " VALUES ($1, 'noop', '{}', NULL), ($1, 'noop', '{\"child\": 1}', 'k')"
            " RETURNING id, payload ? 'child' AS is_child),"
            " edge AS (INSERT INTO job_dependencies (parent_id, child_id)"
            " SELECT p.id, c.id FROM jobs p, jobs c WHERE NOT p.is_child AND c.is_child)"
            " SELECT id FROM jobs ORDER BY is_child",
            workspace,
        )
    )
    # Duplicates due later: they would still hold the key when the parent completes.
    by_sql = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload, unique_key, scheduled_for)"
        " VALUES ($1, 'noop', '{}', 'k', now() + interval '1 hour')"
        " ON CONFLICT DO NOTHING RETURNING id",
        workspace,
    )
    by_client = await enqueue_many(pool, [NewJob(workspace, "noop", unique_key="k", delay_s=3600)])
    await run_burst(pool, db_url)
    rows = await pool.fetch("SELECT id, status::text AS st, error_msg FROM job_queue")
    assert {r["id"]: (r["st"], r["error_msg"]) for r in rows} == {
        parent: ("completed", None),
        child: ("completed", None),
    }
    assert (by_sql, by_client) == (None, [child])


async def test_cli_retry_resumes_a_graph(pool: asyncpg.Pool, db_url: str, workspace: UUID) -> None:
    await pool.execute(graph_sql(workspace, ["a", "b"], [("a", "b")], a={"fail_permanent": "once"}))
    await run_burst(pool, db_url)
    jobs = await by_name(pool)
    assert (jobs["a"]["st"], jobs["b"]["st"]) == ("error", "cancelled")
    done = cli("jobs", "retry", str(jobs["a"]["id"]), url=db_url)
    assert done.returncode == 0, done.stderr
    assert (await by_name(pool))["b"]["st"] == "waiting"


async def test_fan_in_of_1000(pool: asyncpg.Pool, db_url: str, workspace: UUID) -> None:
    await pool.execute(
        "WITH parts AS (INSERT INTO job_queue (workspace_id, job_type, payload)"
        "  SELECT $1, 'noop', jsonb_build_object('part', i) FROM generate_series(1, 1000) i"
        "  RETURNING id),"
        " joined AS (INSERT INTO job_queue (workspace_id, job_type, payload)"
        "  VALUES ($1, 'noop', '{\"name\": \"join\"}') RETURNING id)"
        " INSERT INTO job_dependencies (parent_id, child_id) SELECT parts.id, joined.id"
        " FROM parts, joined",
        workspace,
    )
    assert (await by_name(pool))["join"]["st"] == "waiting"
    await run_burst(pool, db_url, max_concurrent=50)
    assert await statuses(pool) == {"completed": 1001}
    join = (await by_name(pool))["join"]
    last_part = await pool.fetchval(
        "SELECT max(completed_at) FROM job_queue WHERE payload ? 'part'"
    )
    assert join["started_at"] >= last_part


async def settle_calls(conn: asyncpg.Connection) -> int:
    """How often this transaction has settled children (track_functions must be on)."""
    return await conn.fetchval(
        "SELECT coalesce(sum(calls), 0) FROM pg_stat_xact_user_functions"
        " WHERE funcname = 'sidelinja_settle_children'"
    )


async def test_a_batch_of_completions_releases_children_in_one_call(
    pool: asyncpg.Pool, workspace: UUID
) -> None:
    # 200 parents, each with a child of its own, and 1,000 parts of one join: one plain-SQL
    # UPDATE completing 200 parents settles their 200 children with one call, and one UPDATE
    # completing the 1,000 parts settles the join once.
    await pool.execute(
        "WITH p AS (INSERT INTO job_queue (workspace_id, job_type, payload)"
        "  SELECT $1, 'noop', jsonb_build_object('pair', i) FROM generate_series(1, 200) i"
        "  RETURNING id, payload),"
        " c AS (INSERT INTO job_queue (workspace_id, job_type, payload)"
        "  SELECT $1, 'noop', jsonb_build_object('child', i) FROM generate_series(1, 200) i"
        "  RETURNING id, payload)"
        " INSERT INTO job_dependencies (parent_id, child_id) SELECT p.id, c.id FROM p"
        " JOIN c ON p.payload->'pair' = c.payload->'child'",
        workspace,
    )
    await pool.execute(
        "WITH parts AS (INSERT INTO job_queue (workspace_id, job_type, payload)"
        "  SELECT $1, 'noop', jsonb_build_object('part', i) FROM generate_series(1, 1000) i"
        "  RETURNING id),"
        " joined AS (INSERT INTO job_queue (workspace_id, job_type, payload)"
        "  VALUES ($1, 'noop', '{\"name\": \"join\"}') RETURNING id)"
        " INSERT INTO job_dependencies (parent_id, child_id) SELECT parts.id, joined.id"
        " FROM parts, joined",
        workspace,
    )
    assert await statuses(pool) == {"pending": 1200, "waiting": 201}
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SET LOCAL track_functions = 'pl'")
        done = await conn.execute(
            "UPDATE job_queue SET status = 'completed', completed_at = now() WHERE payload ? 'pair'"
        )
        assert done == "UPDATE 200"
        assert await settle_calls(conn) == 1
        released = await conn.fetchval(
            "SELECT count(*) FROM job_queue WHERE payload ? 'child' AND status = 'pending'"
        )
        assert released == 200
        # 999 of the 1,000 parts: the join still waits for the last one.
        await conn.execute(
            "UPDATE job_queue SET status = 'completed', completed_at = now()"
            " WHERE (payload->>'part')::int < 1000"
        )
        assert (await by_name_in(conn))["join"] == "waiting"
        await conn.execute(
            "UPDATE job_queue SET status = 'completed', completed_at = now()"
            " WHERE (payload->>'part')::int = 1000"
        )
        assert (await by_name_in(conn))["join"] == "pending"
        assert await settle_calls(conn) == 3


async def by_name_in(conn: asyncpg.Connection) -> dict[str, str]:
    rows = await conn.fetch(
        "SELECT payload->>'name', status::text FROM job_queue WHERE payload ? 'name'"
    )
    return {r[0]: r[1] for r in rows}


async def test_two_parents_of_one_child_finishing_concurrently_release_it(
    pool: asyncpg.Pool, workspace: UUID
) -> None:
    # Each transaction completes one parent and holds its commit until the other has updated
    # too: whichever settles second waits for the first's lock on the child and then sees its
    # commit, so the child is released exactly once, never left waiting.
    for _ in range(5):
        await pool.execute("DELETE FROM job_queue")
        await pool.execute(graph_sql(workspace, ["a", "b", "c"], [("a", "c"), ("b", "c")]))
        first, second = await pool.acquire(), await pool.acquire()
        try:
            t1, t2 = first.transaction(), second.transaction()
            await t1.start()
            await t2.start()
            await first.execute(
                "UPDATE job_queue SET status = 'completed' WHERE payload->>'name' = 'a'"
            )
            blocked = asyncio.create_task(
                second.execute(
                    "UPDATE job_queue SET status = 'completed' WHERE payload->>'name' = 'b'"
                )
            )
            await wait_until(
                lambda: pool.fetchval(
                    "SELECT count(*) > 0 FROM pg_locks WHERE NOT granted AND locktype = 'transactionid'"
                ),
                10,
            )
            await t1.commit()
            await blocked
            await t2.commit()
        finally:
            await pool.release(first)
            await pool.release(second)
        assert (await by_name(pool))["c"]["st"] == "pending"


async def test_100k_waiting_children_do_not_touch_the_claim(
    pool: asyncpg.Pool, workspace: UUID
) -> None:
    await pool.execute(
        "WITH p AS (INSERT INTO job_queue (workspace_id, job_type, payload, scheduled_for)"
        "  VALUES ($1, 'noop', '{}', now() + interval '1 day') RETURNING id),"
        " c AS (INSERT INTO job_queue (workspace_id, job_type, payload)"
        "  SELECT $1, 'noop', '{}' FROM generate_series(1, 100000) RETURNING id)"
        " INSERT INTO job_dependencies (parent_id, child_id) SELECT p.id, c.id FROM p, c",
        workspace,
    )
    await pool.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload) SELECT $1, 'noop', '{}'"
        " FROM generate_series(1, 10)",
        workspace,
    )
    assert await statuses(pool) == {"pending": 11, "waiting": 100000}
    await pool.execute("VACUUM ANALYZE job_queue")
    worker = UUID(int=1)
    await pool.execute(
        "INSERT INTO job_workers (id, hostname, pid, expires_at) VALUES ($1, 'h', 1, now() + interval '1 h')",
        worker,
    )
    async with pool.acquire() as conn, conn.transaction():
        # A claim of 32 with 10 due: the scan runs to the end of the due jobs, and the waiting
        # children are not in the index it reads.
        plan = await conn.fetchval(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + QUERIES["claim"], worker, 32, None, None
        )
        root = json.loads(plan)[0]["Plan"]
        assert root["Shared Hit Blocks"] + root.get("Shared Read Blocks", 0) < 200, root
        assert root["Actual Rows"] == 10


async def _split(ctx: JobContext, payload: Any) -> Any:
    """Fan-out and fan-in: one child per part, then a join that adds them up."""
    parts = [ctx.add_child(NewJob(ctx.workspace_id, "square", {"n": n})) for n in range(payload.n)]
    ctx.add_join(NewJob(ctx.workspace_id, "total", {}), parts)
    return {"parts": payload.n}


async def _square(ctx: JobContext, payload: Any) -> Any:
    (split,) = await ctx.parent_results()
    assert split.job_type == "split" and split.result == {"parts": 3}
    return {"square": payload.n * payload.n}


async def _total(ctx: JobContext, payload: Any) -> Any:
    parents = await ctx.parent_results()
    return {"total": sum(p.result["square"] for p in parents if p.job_type == "square")}


SPLIT_SQUARE_TOTAL = Registry(
    [job_type("split", _split), job_type("square", _square), job_type("total", _total)]
)


async def test_fan_out_and_join_with_results(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    await pool.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload) VALUES ($1, 'split', '{\"n\": 3}')",
        workspace,
    )
    await run_burst(pool, db_url, SPLIT_SQUARE_TOTAL)
    assert await statuses(pool) == {"completed": 5}
    total = await pool.fetchrow("SELECT result, started_at FROM job_queue WHERE job_type = 'total'")
    assert total["result"] == {"total": 0 + 1 + 4}
    squares = await pool.fetchval(
        "SELECT max(completed_at) FROM job_queue WHERE job_type = 'square'"
    )
    assert total["started_at"] >= squares


async def test_a_fan_out_past_the_bound_fails_the_job_and_adds_nothing(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    # MAX_FOLLOW_UPS children, then the join: one job too many.
    await pool.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload) VALUES ($1, 'split', $2)",
        workspace,
        {"n": MAX_FOLLOW_UPS},
    )
    await run_burst(pool, db_url, SPLIT_SQUARE_TOTAL)
    rows = await pool.fetch(
        "SELECT job_type, status::text AS st, attempts, error_msg FROM job_queue"
    )
    assert [(r["job_type"], r["st"], r["attempts"]) for r in rows] == [("split", "error", 1)]
    assert f"adds more than {MAX_FOLLOW_UPS:,} jobs" in rows[0]["error_msg"]
    assert await pool.fetchval("SELECT count(*) FROM job_dependencies") == 0


async def test_a_join_whose_parents_results_pass_the_cap_fails_alone(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(context, "MAX_PARENT_RESULTS_BYTES", 1_500)
    await pool.execute(
        "WITH parts AS (INSERT INTO job_queue (workspace_id, job_type, payload)"
        "  SELECT $1, 'noop', jsonb_build_object('text', repeat('x', 600))"
        "  FROM generate_series(1, 3) RETURNING id),"
        " joined AS (INSERT INTO job_queue (workspace_id, job_type, payload)"
        "  VALUES ($1, 'total', '{}') RETURNING id)"
        " INSERT INTO job_dependencies (parent_id, child_id) SELECT parts.id, joined.id"
        " FROM parts, joined",
        workspace,
    )
    await run_burst(pool, db_url, Registry([noop.JOB_TYPE, job_type("total", _total)]))
    rows = await pool.fetch("SELECT job_type, status::text AS st, error_msg FROM job_queue")
    assert sorted((r["job_type"], r["st"]) for r in rows) == [
        ("noop", "completed"),
        ("noop", "completed"),
        ("noop", "completed"),
        ("total", "error"),
    ]
    (message,) = [r["error_msg"] for r in rows if r["job_type"] == "total"]
    assert re.search(
        r"this job's 3 parents are 1,8\d\d bytes of JSON together, over the cap of 1,500", message
    ), message


async def test_python_client_enqueues_a_graph(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    first = uuid7s(1)[0]
    ids = await enqueue_many(
        pool,
        [
            NewJob(workspace, "noop", {"name": "first"}, job_id=first),
            NewJob(workspace, "noop", {"name": "second"}, parents=(first,)),
        ],
    )
    assert ids[0] == first
    assert (await by_name(pool))["second"]["st"] == "waiting"
    await run_burst(pool, db_url)
    assert await statuses(pool) == {"completed": 2}


async def test_kill_9_of_a_worker_in_the_middle_of_a_graph(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    # Three layers of 40 slow jobs, each job of a layer waiting for all of the layer before.
    names = [f"{layer}-{i}" for layer in range(3) for i in range(40)]
    edges = [
        (f"{layer}-{i}", f"{layer + 1}-{k}")
        for layer in range(2)
        for i in range(40)
        for k in range(40)
    ]
    slow = {n: {"sleep_ms": 300} for n in names}
    await pool.execute(graph_sql(workspace, names, edges, **slow))
    args = ("run", "--max-concurrent", "20", "--lease", "2s", "--poll-interval", "200ms")
    victim = spawn(*args, url=db_url)
    await wait_until(
        lambda: pool.fetchval(
            "SELECT count(*) > 0 FROM job_queue WHERE status = 'running'"
            " AND payload->>'name' LIKE '1-%'"
        )
    )
    victim.send_signal(signal.SIGKILL)
    victim.communicate()
    survivor = spawn(*args, url=db_url)
    await wait_until(
        lambda: pool.fetchval("SELECT count(*) = 120 FROM job_queue WHERE status = 'completed'"),
        120,
    )
    survivor.send_signal(signal.SIGTERM)
    await asyncio.to_thread(survivor.communicate, timeout=60)
    jobs = await by_name(pool)
    assert any(j["errors"] for j in jobs.values()), "the victim's running jobs were rescued"
    for layer in (1, 2):
        first_start = min(jobs[f"{layer}-{i}"]["started_at"] for i in range(40))
        last_parent = max(jobs[f"{layer - 1}-{i}"]["completed_at"] for i in range(40))
        assert first_start >= last_parent


async def test_retention_prunes_graphs_whole(pool: asyncpg.Pool, workspace: UUID) -> None:
    # g1: a -> b, both old: pruned together. g2: c -> d, c old but d recent: both stay.
    await pool.execute(graph_sql(workspace, ["a", "b", "c", "d"], [("a", "b"), ("c", "d")]))
    await insert_jobs(pool, workspace, 3)
    await pool.execute(
        "UPDATE job_queue SET status = 'completed' WHERE payload->>'name' IN ('a', 'c')"
    )
    await pool.execute("UPDATE job_queue SET status = 'completed' WHERE status = 'pending'")
    await pool.execute(
        "UPDATE job_queue SET completed_at = now() - interval '2 days'"
        " WHERE coalesce(payload->>'name', 'x') <> 'd'"
    )
    async with pool.acquire() as conn:
        deleted = (await store.prune(conn, 86400, 86400, 1000)).deleted
    assert deleted == 5  # three plain jobs and the whole of g1
    assert sorted(await by_name(pool)) == ["c", "d"]
    assert await pool.fetchval("SELECT count(*) FROM job_dependencies") == 1
    # Without its children a parent is never pruned on its own, whatever the batch size.
    async with pool.acquire() as conn:
        assert (await store.prune(conn, 86400, 86400, 1))[0] == 0


async def test_a_graph_kept_whole_does_not_stop_the_pruning_of_others(
    pool: asyncpg.Pool, workspace: UUID
) -> None:
    """Each prune batch takes its graph jobs past retention among the first `batch` it finds. A
    graph that must stay (a join waiting on a parent due next year) with that many finished
    jobs filled every batch and was kept, so no other graph was ever pruned: a batch after
    that found nothing, and the prune stopped."""
    parents = [f"p{i}" for i in range(12)]
    await pool.execute(
        graph_sql(workspace, [*parents, "late", "join"], [(p, "join") for p in [*parents, "late"]])
    )
    await pool.execute(
        "UPDATE job_queue SET status = 'completed', completed_at = now() - interval '3 days'"
        " WHERE payload->>'name' LIKE 'p%'"
    )
    await pool.execute(
        "UPDATE job_queue SET scheduled_for = now() + interval '1 year'"
        " WHERE payload->>'name' = 'late'"
    )
    await pool.execute(graph_sql(workspace, ["a", "b"], [("a", "b")]))
    await pool.execute(
        "UPDATE job_queue SET status = 'completed', completed_at = now() - interval '2 days'"
        " WHERE payload->>'name' IN ('a', 'b')"
    )
    assert await maintenance.prune_past_retention(pool, 86400, 86400, batch=5) == 2
    assert sorted(await by_name(pool)) == sorted([*parents, "late", "join"])


async def test_the_prune_keeps_jobs_another_table_references_and_their_graphs(
    pool: asyncpg.Pool, workspace: UUID
) -> None:
    """A web app's table that references jobs by a foreign key ON DELETE NO ACTION (the
    default) or RESTRICT made the prune's DELETE fail whole: no job was pruned any more. Such a
    job now stays, with its graph; a key ON DELETE SET NULL keeps nothing."""
    names = ["a", "b", "c", "p", "q", "x", "y"]
    await pool.execute(graph_sql(workspace, names, [("p", "q"), ("x", "y")]))
    await pool.execute(
        "UPDATE job_queue SET status = 'completed', completed_at = now() - interval '2 days'"
    )
    ids = {name: row["id"] for name, row in (await by_name(pool)).items()}
    await pool.execute(
        """
        CREATE TABLE "Episode jobs" ("Job" uuid REFERENCES job_queue (id));
        CREATE TABLE clips (job uuid REFERENCES job_queue (id) ON DELETE RESTRICT);
        CREATE TABLE notes (job uuid REFERENCES job_queue (id) ON DELETE SET NULL);
        """
    )
    await pool.execute('INSERT INTO "Episode jobs" VALUES ($1)', ids["a"])
    await pool.execute("INSERT INTO clips VALUES ($1)", ids["q"])
    await pool.execute("INSERT INTO notes VALUES ($1), ($2)", ids["b"], ids["y"])
    assert await maintenance.prune_past_retention(pool, 86400, 86400, batch=2) == 4
    assert sorted(await by_name(pool)) == ["a", "p", "q"]
    assert await pool.fetchval("SELECT count(*) FROM notes WHERE job IS NULL") == 2


async def test_a_prune_that_cannot_read_a_referencing_table_says_so_and_deletes_nothing(
    pool: asyncpg.Pool, workspace: UUID
) -> None:
    await pool.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload, status, completed_at)"
        " VALUES ($1, 'noop', '{\"name\": \"a\"}', 'completed', now() - interval '2 days')",
        workspace,
    )
    await pool.execute("CREATE TABLE private_refs (job uuid REFERENCES job_queue (id))")
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SET LOCAL ROLE sidelinja_platform_admin")
        with pytest.raises(store.PruneBlocked, match="private_refs.*grant it SELECT"):
            await maintenance.prune_past_retention(conn, 86400, 86400)
    assert sorted(await by_name(pool)) == ["a"]


async def test_an_edge_must_name_existing_jobs(pool: asyncpg.Pool, workspace: UUID) -> None:
    await pool.execute(graph_sql(workspace, ["a", "b"], [("a", "b")]))
    a = (await by_name(pool))["a"]["id"]
    with pytest.raises(asyncpg.ForeignKeyViolationError):
        await pool.execute(
            "INSERT INTO job_dependencies (parent_id, child_id) VALUES ($1, $2)", a, uuid7s(1)[0]
        )
    await pool.execute("DELETE FROM job_queue WHERE id = $1", a)
    assert await pool.fetchval("SELECT count(*) FROM job_dependencies") == 0


async def test_the_episode_pipeline_end_to_end(
    pool: asyncpg.Pool,
    db_url: str,
    workspace: UUID,
    media_root: Path,
    whisper_fake: FakeWhisper,
    forgejo_fake: FakeForgejo,
    ai_gateway: FakeAiGateway,
) -> None:
    done = await asyncio.to_thread(
        cli,
        "pipeline", "episode", "--workspace", str(workspace), "--audio", "episodes/ep1.wav",
        "--branch", "main", "--title", "Valgspesial",
        url=db_url,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    ids = dict(line.split() for line in done.stdout.splitlines())
    assert sorted(ids) == ["openrouter_analyze", "srt_parse", "whisper_transcribe"]
    parse_id = UUID(ids["srt_parse"])
    why = await asyncio.to_thread(cli, "jobs", "why", str(parse_id), url=db_url)
    assert f"waiting for parent {ids['whisper_transcribe']} (whisper_transcribe, pending)" in (
        why.stdout
    )
    shown = json.loads(
        (await asyncio.to_thread(cli, "jobs", "show", str(parse_id), url=db_url)).stdout
    )
    assert [p["id"] for p in shown["parents"]] == [ids["whisper_transcribe"]]
    assert [c["id"] for c in shown["children"]] == [ids["openrouter_analyze"]]

    config = service_config(
        media_root,
        whisper=whisper_fake,
        forgejo=forgejo_fake,
        AI_GATEWAY_URL=ai_gateway.url,
        AI_GATEWAY_KEY=ai_gateway.key,
    )
    await run_burst(pool, db_url, config=config)
    rows = {
        r["job_type"]: r for r in await pool.fetch("SELECT *, status::text AS st FROM job_queue")
    }
    assert sorted(rows) == [
        "generate_embeddings",
        "openrouter_analyze",
        "srt_parse",
        "whisper_transcribe",
    ]
    for name in ("whisper_transcribe", "srt_parse", "openrouter_analyze"):
        assert rows[name]["st"] == "completed", rows[name]["error_msg"]
    # srt_parse read the SRT whisper committed, at that commit, from its parent's result.
    commit = rows["whisper_transcribe"]["result"]["forgejo"]["commit_sha"]
    assert rows["srt_parse"]["result"]["source"]["forgejo"]["ref"] == commit
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM transcript_segments WHERE workspace_id = $1", workspace
        )
        == rows["srt_parse"]["result"]["segments"]
        == 10
    )
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM ai_results WHERE kind = 'openrouter_analyze' AND source_ref = 'ep1'"
        )
        == 1
    )
    # The embeddings: the transcript's passages, a child of srt_parse. Storing vectors needs
    # pgvector; without it the job fails at once, naming it, and nothing else is touched.
    embed = rows["generate_embeddings"]
    assert embed["payload"]["items"][0]["ref"] == "ep1#1"
    parents = await pool.fetch(
        "SELECT parent_id FROM job_dependencies WHERE child_id = $1", embed["id"]
    )
    assert [p["parent_id"] for p in parents] == [parse_id]
    if await pool.fetchval("SELECT to_regclass('knowledge_embeddings') IS NULL"):
        assert (embed["st"], "pgvector" in embed["error_msg"]) == ("error", True)
    else:
        assert embed["st"] == "completed", embed["error_msg"]


async def test_whisper_alone_adds_its_parse_as_a_child(
    pool: asyncpg.Pool,
    db_url: str,
    workspace: UUID,
    media_root: Path,
    whisper_fake: FakeWhisper,
    forgejo_fake: FakeForgejo,
) -> None:
    job_id = await enqueue_many(
        pool,
        [
            NewJob(
                workspace,
                "whisper_transcribe",
                {
                    "audio_path": "episodes/ep1.wav",
                    "transcript_ref": "ep-1",
                    "forgejo": {"owner": "sidelinja", "repo": "transcripts", "path": "a.srt"},
                },
            )
        ],
    )
    config = service_config(media_root, whisper=whisper_fake, forgejo=forgejo_fake)
    await run_burst(pool, db_url, config=config)
    parse = await pool.fetchrow(
        "SELECT *, status::text AS st FROM job_queue WHERE job_type = 'srt_parse'"
    )
    assert parse["st"] == "completed", parse["error_msg"]
    assert (
        await pool.fetchval(
            "SELECT parent_id FROM job_dependencies WHERE child_id = $1", parse["id"]
        )
        == job_id[0]
    )


async def test_a_confined_app_role_declares_and_resumes_graphs(
    pool: asyncpg.Pool, workspace: UUID
) -> None:
    # The web app's role, confined to one workspace by row-level security, writes the graph and
    # retries it.
    async with pool.acquire() as conn:
        async with conn.transaction():
            await conn.execute("SET LOCAL ROLE sidelinja_app")
            await conn.execute(
                "SELECT set_config('sidelinja.workspace_id', $1, true)", str(workspace)
            )
            await conn.execute(graph_sql(workspace, ["a", "b"], [("a", "b")]))
        assert {n: j["st"] for n, j in (await by_name(pool)).items()} == {
            "a": "pending",
            "b": "waiting",
        }
        await pool.execute(
            "UPDATE job_queue SET status = 'error', error_msg = 'no' WHERE payload->>'name' = 'a'"
        )
        assert (await by_name(pool))["b"]["st"] == "cancelled"
        async with conn.transaction():
            await conn.execute("SET LOCAL ROLE sidelinja_app")
            await conn.execute(
                "SELECT set_config('sidelinja.workspace_id', $1, true)", str(workspace)
            )
            await conn.execute(
                "UPDATE job_queue SET status = 'pending' WHERE payload->>'name' = 'a'"
            )
            edges = await conn.fetchval("SELECT count(*) FROM job_dependencies")
        assert edges == 1
        assert (await by_name(pool))["b"]["st"] == "waiting"
        # Another workspace's job does not exist for this role: no edge to or from it.
        other = await pool.fetchval(
            "WITH w AS (INSERT INTO workspaces (name) VALUES ('other') RETURNING id)"
            " INSERT INTO job_queue (workspace_id, job_type, payload)"
            " SELECT id, 'noop', '{}' FROM w RETURNING id"
        )
        b = (await by_name(pool))["b"]["id"]
        with pytest.raises(asyncpg.ForeignKeyViolationError):
            async with conn.transaction():
                await conn.execute("SET LOCAL ROLE sidelinja_app")
                await conn.execute(
                    "SELECT set_config('sidelinja.workspace_id', $1, true)", str(workspace)
                )
                await conn.execute(
                    "INSERT INTO job_dependencies (parent_id, child_id) VALUES ($1, $2)", b, other
                )


async def test_meeting_summarize_map_reduce_as_a_graph(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, ai_gateway: FakeAiGateway
) -> None:
    await pool.execute(
        "UPDATE workspaces SET settings = $2 WHERE id = $1",
        workspace,
        {"ai": {"context_tokens": 150}},  # about 450 characters a part
    )
    text = "\n".join(f"Linje {i}: vi diskuterte budsjettet for kvartal {i}." for i in range(40))
    [first] = await enqueue_many(
        pool,
        [NewJob(workspace, "meeting_summarize", {"text": text, "ref": "m1", "fan_out": True})],
    )
    config = ServiceConfig({"AI_GATEWAY_URL": ai_gateway.url, "AI_GATEWAY_KEY": ai_gateway.key})
    await run_burst(pool, db_url, config=config)
    rows = await pool.fetch(
        "SELECT *, status::text AS st FROM job_queue WHERE job_type = 'meeting_summarize'"
    )
    assert {r["st"] for r in rows} == {"completed"}, [r["error_msg"] for r in rows]
    split = next(r for r in rows if r["id"] == first)["result"]
    parts = [r for r in rows if r["payload"].get("part")]
    [join] = [r for r in rows if r["payload"].get("combine")]
    assert split["parts"] == len(parts) > 1 and split["join"] == str(join["id"])
    assert join["started_at"] >= max(p["completed_at"] for p in parts)
    requests = ai_gateway.chat_requests()
    combines = [r for r in requests if "Partial answers for consecutive parts" in r.message("user")]
    assert combines and len(requests) == len(parts) + len(combines)
    assert join["result"]["parts"] == len(parts)
    assert join["result"]["usage"]["calls"] == len(requests)
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM ai_results WHERE kind = 'meeting_summarize' AND source_ref = 'm1'"
        )
        == 1
    )


async def test_an_edge_between_two_workspaces_is_refused_to_every_role(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """A role that sees every workspace (the owner, the platform role) joined a job of one
    workspace to a job of another: the child waited for, was cancelled by, and read the result
    of the other workspace's job (`ctx.parent_results`). An edge joins jobs of one workspace."""
    other = await pool.fetchval("INSERT INTO workspaces (name) VALUES ('other') RETURNING id")
    theirs = await completed_a_minute_ago(pool, other, '{"secret": 1}')
    ours = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload) VALUES ($1, 'peek', '{}')"
        " RETURNING id",
        workspace,
    )
    with pytest.raises(asyncpg.CheckViolationError, match="another workspace"):
        await pool.execute(
            "INSERT INTO job_dependencies (parent_id, child_id) VALUES ($1, $2)", theirs, ours
        )
    seen: list[Any] = []

    async def peek(ctx: JobContext, payload: Any) -> None:
        seen.append([p.result for p in await ctx.parent_results()])

    await run_burst(pool, db_url, Registry([job_type("peek", peek)]))
    assert seen == [[]]


async def test_a_deleted_parent_lets_its_waiting_child_go_on(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """Deleting a job deletes its edges. Its waiting child was left `waiting` with no parent
    left to finish, for good (holding its unique key). It is settled on the edges it has left:
    here a completed parent, so it runs."""
    await pool.execute(graph_sql(workspace, ["a", "b", "c"], [("a", "c"), ("b", "c")]))
    jobs = await by_name(pool)
    await pool.execute("UPDATE job_queue SET status = 'completed' WHERE id = $1", jobs["b"]["id"])
    await pool.execute("DELETE FROM job_queue WHERE id = $1", jobs["a"]["id"])
    assert (await by_name(pool))["c"]["st"] == "pending"
    await run_burst(pool, db_url)
    assert (await by_name(pool))["c"]["st"] == "completed"


@pytest.mark.parametrize("version", [35, 39])
async def test_edges_across_workspaces_made_before_the_rule_are_removed_by_its_migration(
    pool: asyncpg.Pool, workspace: UUID, version: int
) -> None:
    """Migration 0035 deletes the edges across workspaces made before it refused them, and 0039
    those made since by moving an edge or a job; a child they held waiting is settled on the
    edges it has left."""
    await pool.execute("DROP TRIGGER job_dependencies_in_one_workspace ON job_dependencies")
    other = await pool.fetchval("INSERT INTO workspaces (name) VALUES ('other') RETURNING id")
    theirs, mine, done = [
        await pool.fetchval(
            "INSERT INTO job_queue (workspace_id, job_type, payload, status, created_at)"
            " VALUES ($1, 'noop', '{}', $2, now() - interval '1 minute') RETURNING id",
            ws,
            status,
        )
        for ws, status in ((other, "pending"), (workspace, "pending"), (workspace, "completed"))
    ]
    async with pool.acquire() as conn:
        held, free = await noop_jobs(conn, workspace, 2)
    await pool.execute(
        "INSERT INTO job_dependencies (parent_id, child_id)"
        " SELECT * FROM unnest($1::uuid[], $2::uuid[])",
        [theirs, mine, theirs, done],
        [held, held, free, free],
    )
    (migration,) = [m for m in migrate.shipped_migrations() if m.version == version]
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(migration.sql)
    edges = await pool.fetch("SELECT parent_id, child_id FROM job_dependencies")
    assert {(e["parent_id"], e["child_id"]) for e in edges} == {(mine, held), (done, free)}
    rows = await pool.fetch(
        "SELECT id, status::text AS st FROM job_queue WHERE id = ANY($1)", [held, free]
    )
    assert {r["id"]: r["st"] for r in rows} == {held: "waiting", free: "pending"}


async def test_a_job_in_a_graph_keeps_its_instant_so_no_cycle_can_form(
    pool: asyncpg.Pool, workspace: UUID
) -> None:
    """The cycle check trusts `created_at`: an edge points forward in time, or is checked among
    the jobs of its instant. A writer that moved a parent's `created_at` past its child's could
    then add the edge back: a cycle, whose jobs, once cancelled by a failed ancestor, named each
    other in `cancelled_by`, and no retry of that ancestor brought them back. A job in a graph
    keeps its `created_at`; a job outside one may change it and join a graph afterwards."""
    await pool.execute(graph_sql(workspace, ["a", "b", "lone"], [("a", "b")]))
    jobs = await by_name(pool)
    a, b = jobs["a"]["id"], jobs["b"]["id"]
    for job in (a, b):
        with pytest.raises(asyncpg.CheckViolationError, match="in a job graph"):
            await pool.execute(
                "UPDATE job_queue SET created_at = now() + interval '1 hour' WHERE id = $1", job
            )
    with pytest.raises(asyncpg.CheckViolationError):
        await pool.execute(
            "INSERT INTO job_dependencies (parent_id, child_id) VALUES ($1, $2)", b, a
        )
    await pool.execute(
        "UPDATE job_queue SET created_at = now() + interval '1 hour', priority = 1 WHERE id = $1",
        jobs["lone"]["id"],
    )
    await pool.execute(
        "UPDATE job_queue SET created_at = created_at, priority = 2 WHERE id = ANY($1)", [a, b]
    )
    await pool.execute(
        "INSERT INTO job_dependencies (parent_id, child_id) VALUES ($1, $2)", b, jobs["lone"]["id"]
    )


async def test_an_edge_keeps_its_jobs_and_a_job_in_a_graph_its_workspace(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """The graph's checks run when an edge is inserted. A role that sees every workspace could
    go round them: re-point an edge at another workspace's job, or move a job with its edges
    to another workspace; either way the child read the other workspace's result as its
    parent's. An edge keeps its two jobs (its `run_anyway` may change), and a job in a graph
    keeps its workspace; a job outside any graph may still move."""
    other = await pool.fetchval("INSERT INTO workspaces (name) VALUES ('other') RETURNING id")
    theirs = await completed_a_minute_ago(pool, other, '{"secret": 1}')
    await pool.execute(graph_sql(workspace, ["a", "c", "lone"], [("a", "c")]))
    jobs = await by_name(pool)
    a, c = jobs["a"]["id"], jobs["c"]["id"]
    with pytest.raises(asyncpg.CheckViolationError, match="cannot be moved"):
        await pool.execute(
            "UPDATE job_dependencies SET parent_id = $1 WHERE child_id = $2", theirs, c
        )
    with pytest.raises(asyncpg.CheckViolationError, match="cannot be moved"):
        await pool.execute("UPDATE job_dependencies SET child_id = $1 WHERE child_id = $2", a, c)
    await pool.execute("UPDATE job_dependencies SET run_anyway = true WHERE child_id = $1", c)
    for job in (a, c):
        with pytest.raises(
            asyncpg.CheckViolationError, match="in a job graph: it keeps its workspace_id"
        ):
            await pool.execute("UPDATE job_queue SET workspace_id = $1 WHERE id = $2", other, job)
    await pool.execute(
        "UPDATE job_queue SET workspace_id = $1 WHERE id = $2", other, jobs["lone"]["id"]
    )
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM job_dependencies WHERE parent_id = $1 AND child_id = $2", a, c
        )
        == 1
    )


async def _graph_of_two(conn: asyncpg.Connection, workspace: UUID) -> None:
    """Two jobs and an edge between them, as the web app declares a graph: one transaction."""
    ids = await conn.fetch(
        "INSERT INTO job_queue (workspace_id, job_type, payload)"
        " SELECT $1, 'noop', '{}' FROM generate_series(1, 2) RETURNING id",
        workspace,
    )
    await conn.execute(
        "INSERT INTO job_dependencies (parent_id, child_id) VALUES ($1, $2)",
        ids[0]["id"],
        ids[1]["id"],
    )


async def test_a_graph_insert_left_open_holds_up_no_other_workspace_s_graphs(
    pool: asyncpg.Pool, workspace: UUID
) -> None:
    """The lock against two transactions each adding half of a cycle was one for the cluster:
    a web request that inserted a graph and went on working before its commit held every
    other workspace's graph inserts (and the worker's follow-ups with edges) as long. It is
    taken per workspace: only the same workspace's graphs wait."""
    other = await pool.fetchval("INSERT INTO workspaces (name) VALUES ('other') RETURNING id")
    async with pool.acquire() as slow, pool.acquire() as quick:
        async with slow.transaction():
            await _graph_of_two(slow, workspace)
            async with quick.transaction():
                await asyncio.wait_for(_graph_of_two(quick, other), 5)
            same = asyncio.ensure_future(_graph_of_two_alone(pool, workspace))
            await wait_for(  # the same workspace's graph waits for the first
                lambda: pool.fetchval(
                    "SELECT EXISTS (SELECT FROM pg_locks"
                    " WHERE locktype = 'advisory' AND NOT granted)"
                ),
                5,
                "the same workspace's graph waiting on the lock",
            )
            assert not same.done()
        await asyncio.wait_for(same, 5)
    assert await pool.fetchval("SELECT count(*) FROM job_dependencies") == 3


async def _graph_of_two_alone(pool: asyncpg.Pool, workspace: UUID) -> None:
    async with pool.acquire() as conn, conn.transaction():
        await _graph_of_two(conn, workspace)


async def test_a_job_reads_no_parent_of_another_workspace_even_past_the_triggers(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """A superuser can write past every trigger (session_replication_role = replica, as a
    restore does): an edge across workspaces made so still hands the job no result, relative
    or child but its own workspace's."""
    other = await pool.fetchval("INSERT INTO workspaces (name) VALUES ('other') RETURNING id")
    results = [
        await completed_a_minute_ago(pool, other, '{"secret": 1}'),
        await completed_a_minute_ago(pool, workspace, '{"mine": 1}'),
    ]
    ours = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload) VALUES ($1, 'peek', '{}')"
        " RETURNING id",
        workspace,
    )
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SET LOCAL session_replication_role = replica")
        await conn.execute(
            "INSERT INTO job_dependencies (parent_id, child_id) SELECT unnest($1::uuid[]), $2",
            results,
            ours,
        )
        # and a child elsewhere, of the type the job looks for before adding its own
        theirs = await conn.fetchval(
            "INSERT INTO job_queue (workspace_id, job_type, payload, status)"
            " VALUES ($1, 'srt_parse', '{}', 'completed') RETURNING id",
            other,
        )
        await conn.execute(
            "INSERT INTO job_dependencies (parent_id, child_id) VALUES ($1, $2)", ours, theirs
        )
    seen: list[Any] = []

    async def peek(ctx: JobContext, payload: Any) -> None:
        seen.append([p.result for p in await ctx.parent_results()])
        seen.append(await ctx.children())
        seen.append(await ctx.has_child("srt_parse"))

    await run_burst(pool, db_url, Registry([job_type("peek", peek)]))
    assert seen == [['{"mine": 1}'], [], False]  # the raw JSON, as stored
    async with pool.acquire() as conn:  # what `jobs show` and `jobs why` list
        relatives = await store.job_relatives(conn, ours)
    assert [(r["relation"], r["id"]) for r in relatives] == [("parent", results[1])]


@pytest.mark.parametrize("how", ["follow-up", "child"])
async def test_a_job_adds_jobs_to_its_own_workspace_only(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, how: str
) -> None:
    """A job's follow-ups and children are committed with its completion by the worker, which
    may write every workspace: a handler that named another workspace (from its payload, say)
    put a job there, with no check anywhere. The job fails for good, naming the rule, and
    nothing is added."""
    other = await pool.fetchval("INSERT INTO workspaces (name) VALUES ('other') RETURNING id")

    async def reach(ctx: JobContext, payload: Any) -> None:
        job = NewJob(str(payload.model_extra["to"]), "noop", {})
        if how == "child":
            ctx.add_child(job)
        else:
            ctx.enqueue_on_success(job)

    job = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload) VALUES ($1, 'reach', $2)"
        " RETURNING id",
        workspace,
        {"to": str(other)},
    )
    await run_burst(pool, db_url, Registry([job_type("reach", reach)]))
    row = await pool.fetchrow(
        "SELECT status::text AS st, error_msg FROM job_queue WHERE id = $1", job
    )
    assert row["st"] == "error" and "its own workspace" in row["error_msg"]
    assert await pool.fetchval("SELECT count(*) FROM job_queue") == 1


async def test_a_parent_put_back_in_the_queue_holds_its_released_children_again(
    pool: asyncpg.Pool, workspace: UUID
) -> None:
    """A parent's failure released its clean-up (a `run_anyway` edge); the parent, retried,
    was due again while the clean-up still waited in the queue, and a worker took both: the
    clean-up ran under the parent's second attempt. Now a job put back in the queue holds its
    released children again, and a child that goes back to the queue while a parent is
    unfinished waits for it; both go on when the parent finishes again."""
    await pool.execute(
        graph_sql(workspace, ["parent", "other", "cleanup", "child"], [("parent", "child")])
    )
    jobs = await by_name(pool)
    parent, cleanup, child = jobs["parent"]["id"], jobs["cleanup"]["id"], jobs["child"]["id"]
    await pool.execute(
        "INSERT INTO job_dependencies (parent_id, child_id, run_anyway) VALUES ($1, $2, true)",
        parent,
        cleanup,
    )

    async def status(job_id: UUID) -> str:
        return await pool.fetchval("SELECT status::text FROM job_queue WHERE id = $1", job_id)

    async def set_status(job_id: UUID, to: str) -> None:
        await pool.execute(
            "UPDATE job_queue SET status = $2::job_status, completed_at = CASE WHEN $2 IN"
            " ('completed', 'error', 'cancelled') THEN now() END WHERE id = $1",
            job_id,
            to,
        )

    await set_status(parent, "error")
    assert (await status(cleanup), await status(child)) == ("pending", "cancelled")
    # The documented retry: the clean-up waits again, the cancelled child comes back.
    await pool.execute(
        "UPDATE job_queue SET status = 'pending', attempts = 0, scheduled_for = now()"
        " WHERE id = $1",
        parent,
    )
    assert (await status(cleanup), await status(child)) == ("waiting", "waiting")
    await set_status(parent, "completed")
    assert (await status(cleanup), await status(child)) == ("pending", "pending")
    # A child running when its parent is put back is left to run; if it then goes back to
    # the queue (a transient failure), it waits for the parent.
    await set_status(child, "running")
    await set_status(parent, "pending")
    assert (await status(child), await status(cleanup)) == ("running", "waiting")
    await set_status(child, "retry")
    assert await status(child) == "waiting"
    await set_status(parent, "completed")
    assert (await status(child), await status(cleanup)) == ("pending", "pending")
    # Put back by hand while its parent has failed, a job runs, as before: held only by an
    # unfinished parent, never cancelled again.
    await set_status(parent, "pending")
    await set_status(parent, "error")
    assert await status(child) == "cancelled"
    await set_status(child, "pending")
    assert await status(child) == "pending"


async def test_a_job_brought_back_from_cancelled_holds_its_released_children_again(
    pool: asyncpg.Pool, workspace: UUID
) -> None:
    """A grandparent's failure cancelled its child, whose clean-up (a `run_anyway` edge) was
    released; the grandparent's retry brought the cancelled child back to `waiting`, and the
    clean-up, still queued, ran beside it."""
    await pool.execute(graph_sql(workspace, ["top", "middle", "cleanup"], [("top", "middle")]))
    jobs = await by_name(pool)
    top, middle, cleanup = (jobs[n]["id"] for n in ("top", "middle", "cleanup"))
    await pool.execute(
        "INSERT INTO job_dependencies (parent_id, child_id, run_anyway) VALUES ($1, $2, true)",
        middle,
        cleanup,
    )

    async def states() -> tuple[str, str]:
        rows = await pool.fetch(
            "SELECT id, status::text AS st FROM job_queue WHERE id = ANY($1)", [middle, cleanup]
        )
        by_id = {r["id"]: r["st"] for r in rows}
        return by_id[middle], by_id[cleanup]

    assert await states() == ("waiting", "waiting")
    await pool.execute(
        "UPDATE job_queue SET status = 'error', completed_at = now() WHERE id = $1", top
    )
    assert await states() == ("cancelled", "pending")
    await pool.execute(
        "UPDATE job_queue SET status = 'pending', attempts = 0, scheduled_for = now()"
        " WHERE id = $1",
        top,
    )
    assert await states() == ("waiting", "waiting")
