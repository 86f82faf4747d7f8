"""`jobs why` for a row that says running while nothing runs it: its worker is gone."""

from __future__ import annotations

from uuid import UUID, uuid4

import asyncpg

from tests.helpers import cli


async def _running_under(pool: asyncpg.Pool, workspace: UUID, worker: UUID) -> UUID:
    job_id: UUID = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload, status, attempts, started_at,"
        " worker_id) VALUES ($1, 'noop', '{}', 'running', 1, now() - interval '1 hour', $2)"
        " RETURNING id",
        workspace,
        worker,
    )
    return job_id


async def _worker(pool: asyncpg.Pool, expires_at: str) -> UUID:
    """A worker row whose lease ends at `expires_at` (SQL)."""
    worker = uuid4()
    await pool.execute(
        "INSERT INTO job_workers (id, hostname, pid, expires_at)"
        f" VALUES ($1, 'host', 1, {expires_at})",
        worker,
    )
    return worker


def _reasons(db_url: str, job_id: UUID) -> list[str]:
    out = cli("jobs", "why", str(job_id), url=db_url)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


async def test_a_running_job_whose_worker_is_gone_says_so(
    db_url: str, pool: asyncpg.Pool, workspace: UUID
) -> None:
    worker = await _worker(pool, "'2026-01-02 03:04:05+00'")
    job_id = await _running_under(pool, workspace, worker)
    reasons = _reasons(db_url, job_id)
    assert reasons[1:] == [
        f"- its worker {worker} is gone (its lease expired at 2026-01-02 03:04:05 UTC), and no "
        "worker is live to put the job back in the queue: start one with `sidelinja-worker run`"
    ]


async def test_an_orphan_is_told_from_a_live_workers_job(
    db_url: str, pool: asyncpg.Pool, workspace: UUID
) -> None:
    live = await _worker(pool, "now() + interval '1 hour'")
    orphan_worker = uuid4()  # no row at all: reaped, or never had one
    orphan = await _running_under(pool, workspace, orphan_worker)
    assert _reasons(db_url, orphan)[1:] == [
        f"- its worker {orphan_worker} is gone: a live worker's rescue puts the job back in "
        "the queue, counted as an attempt"
    ]
    held = await _running_under(pool, workspace, live)
    assert len(_reasons(db_url, held)) == 1  # running, and its worker is alive: nothing to add
