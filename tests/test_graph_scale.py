"""Job graphs of hostile size or shape, as a careless plain-SQL writer may declare them: each
statement a graph makes the triggers run stays bounded in the work it does and the bytes it
writes, so the worker's statements (with their timeouts) and the locks they hold stay short."""

from __future__ import annotations

from uuid import UUID

import asyncpg

from sidelinja_worker.queue import maintenance, store
from tests.helpers import chain, rows_read

# The longest message a child cancelled by its parent's failure carries (migration 0033).
MAX_CANCEL_MESSAGE = 1400


async def fan_out(pool: asyncpg.Pool, workspace: UUID, children: int) -> UUID:
    """A parent and `children` children in one statement; the parent's id."""
    return await pool.fetchval(
        "WITH p AS (INSERT INTO job_queue (workspace_id, job_type, payload)"
        "  VALUES ($1, 'noop', '{}') RETURNING id),"
        " c AS (INSERT INTO job_queue (workspace_id, job_type, payload)"
        "  SELECT $1, 'noop', '{}' FROM generate_series(1, $2) RETURNING id),"
        " e AS (INSERT INTO job_dependencies (parent_id, child_id) SELECT p.id, c.id FROM p, c)"
        " SELECT id FROM p",
        workspace,
        children,
    )


async def test_a_deep_chain_cancelled_by_its_head_carries_bounded_messages(
    pool: asyncpg.Pool, workspace: UUID
) -> None:
    """Each cancelled child carried its parent's whole message, so a chain's messages grew with
    the square of its depth: 10,000 deep wrote 3.5 billion characters, 65 s in the statement
    that failed its head. Now each is cut, and still names its parent first."""
    ids = await chain(pool, workspace, 300)
    await pool.execute(
        "UPDATE job_queue SET status = 'error', completed_at = now(), error_msg = 'disk full'"
        " WHERE id = $1",
        ids[0],
    )
    rows = {
        r["id"]: r
        for r in await pool.fetch("SELECT id, status::text AS st, error_msg FROM job_queue")
    }
    assert rows[ids[1]]["error_msg"] == f"parent {ids[0]} (noop) ended in error: disk full"
    assert rows[ids[2]]["error_msg"].startswith(
        f"parent {ids[1]} (noop) ended in cancelled: parent {ids[0]} (noop) ended in error"
    )
    assert {rows[i]["st"] for i in ids[1:]} == {"cancelled"}
    longest = max(len(rows[i]["error_msg"]) for i in ids[1:])
    assert longest < MAX_CANCEL_MESSAGE, longest


async def test_children_do_not_copy_a_huge_parent_error_or_type(
    pool: asyncpg.Pool, workspace: UUID
) -> None:
    """A plain-SQL writer sets a parent's error and type to any size; each of its children
    copied both (1,000 children of a 1 MB error: 24 s and 1 GB)."""
    parent = await fan_out(pool, workspace, 20)
    await pool.execute(
        "UPDATE job_queue SET job_type = repeat('t', 100000), status = 'error',"
        " completed_at = now(), error_msg = repeat('x', 1000000) WHERE id = $1",
        parent,
    )
    lengths = await pool.fetch(
        "SELECT octet_length(error_msg) AS n FROM job_queue WHERE cancelled_by = $1", parent
    )
    assert len(lengths) == 20
    assert max(r["n"] for r in lengths) < MAX_CANCEL_MESSAGE


async def test_the_prune_walks_a_fan_out_by_index_after_analyze(
    pool: asyncpg.Pool, workspace: UUID
) -> None:
    """Once ANALYZE had seen a fan-out (one parent_id for every edge), the prune's walk took each
    lookup of a job's children for the whole table and scanned every edge per job: a finished
    graph of 100,001 jobs took 372 s, past the prune's 10 s timeout at every turn, and nothing
    was pruned any more. Now each job's edges are read by index."""
    children = 3000
    parent = await fan_out(pool, workspace, children)
    await pool.execute(
        "UPDATE job_queue SET status = 'completed', completed_at = now() - interval '30 days'"
    )
    await pool.execute("ANALYZE job_queue; ANALYZE job_dependencies")
    async with pool.acquire() as conn, conn.transaction():
        before = await rows_read(conn)
        deleted = (await store.prune(conn, 86400, 86400, 1000)).deleted
        read = await rows_read(conn) - before
    assert deleted == children + 1
    assert await pool.fetchval("SELECT count(*) FROM job_queue WHERE id = $1", parent) == 0
    assert read < 30 * children, read


async def test_a_graph_kept_whole_is_walked_once_per_prune(
    pool: asyncpg.Pool, workspace: UUID
) -> None:
    """A graph with a job not past retention stays whole, and each prune batch that took some of
    its finished jobs walked all of it again: a kept graph of 100,000 finished jobs cost each
    prune a hundred walks of 100,000 jobs (103 s) and deleted nothing. Now the prune's later
    batches pass over the jobs of graphs it has found kept."""
    children = 3000
    parent = await fan_out(pool, workspace, children)
    await pool.execute(
        "UPDATE job_queue SET status = 'completed', completed_at = now() - interval '30 days'"
        " WHERE id <> $1",
        parent,
    )
    await pool.execute(
        "UPDATE job_queue SET status = 'completed', completed_at = now() WHERE id = $1", parent
    )
    after = await fan_out(pool, workspace, 2)  # a graph past retention behind the kept one
    await pool.execute(
        "UPDATE job_queue SET status = 'completed', completed_at = now() - interval '29 days'"
        " WHERE id = $1 OR id IN (SELECT child_id FROM job_dependencies WHERE parent_id = $1)",
        after,
    )
    async with pool.acquire() as conn, conn.transaction():
        before = await rows_read(conn)
        deleted = await maintenance.prune_past_retention(conn, 86400, 86400, batch=100)
        read = await rows_read(conn) - before
    assert deleted == 3
    assert await pool.fetchval("SELECT count(*) FROM job_queue") == children + 1
    assert read < 40 * children, read  # ~54,000 here; 794,000 before
