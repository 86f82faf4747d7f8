"""Job graphs: dependencies declared in plain SQL, failure rules, results along edges."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Awaitable, Callable
from typing import Any
from uuid import UUID

import asyncpg
import pytest

from sidelinja_worker.queue.queries import QUERIES
from tests.helpers import cli, run_burst, statuses

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
        await conn.add_listener("sidelinja_job_due", lambda *a: got.put_nowait(a[2]))
        await pool.execute(graph_sql(workspace, ["p", "c"], [("p", "c")]))
        await asyncio.wait_for(got.get(), 5)  # the insert's own notification
        await pool.execute("UPDATE job_queue SET status = 'completed' WHERE payload->>'name' = 'p'")
        await asyncio.wait_for(got.get(), 5)
        assert (await by_name(pool))["c"]["st"] == "pending"
    finally:
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
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + QUERIES["claim"], worker, 32, None
        )
        root = json.loads(plan)[0]["Plan"]
        assert root["Shared Hit Blocks"] + root.get("Shared Read Blocks", 0) < 200, root
        assert root["Actual Rows"] == 10
