"""Each outcome class, timeouts, payload validation, dedupe, cancel and retention."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import asyncpg
import pytest
from pydantic import BaseModel

from sidelinja_worker.queue import client, store
from sidelinja_worker.queue.context import JobContext
from sidelinja_worker.queue.errors import Defer, PermanentError, RetryJob
from sidelinja_worker.queue.registry import Registry
from sidelinja_worker.queue.settings import WorkerSettings
from sidelinja_worker.queue.worker import Worker
from tests.helpers import cli, job_type, run_burst, running_worker, statuses, wait_for_sql


async def _insert(
    pool: asyncpg.Pool, workspace: UUID, name: str, payload: str = "{}", **columns: Any
) -> UUID:
    extra = "".join(f", {c}" for c in columns)
    values = "".join(f", ${i + 4}" for i in range(len(columns)))
    return await pool.fetchval(
        f"INSERT INTO job_queue (workspace_id, job_type, payload{extra})"
        f" VALUES ($1, $2, $3::text::jsonb{values}) RETURNING id",
        workspace,
        name,
        payload,
        *columns.values(),
    )


async def _job(pool: asyncpg.Pool, job_id: UUID) -> asyncpg.Record:
    row = await store.get_job(pool, job_id)
    assert row is not None
    return row


async def test_timeout_cancels_the_handler_and_retries(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    finished = []

    async def slow(ctx: JobContext, payload: Any) -> None:
        await asyncio.sleep(30)
        finished.append(ctx.job_id)

    registry = Registry([job_type("slow", slow, timeout_s=0.2)])
    default = await _insert(pool, workspace, "slow")
    override = await _insert(pool, workspace, "slow", timeout_s=1)
    await run_burst(pool, db_url, registry, max_concurrent=2)
    assert not finished
    a, b = await _job(pool, default), await _job(pool, override)
    assert (a["status"], a["error_msg"]) == ("retry", "timed out after 0.2 s")
    assert (b["status"], b["error_msg"]) == ("retry", "timed out after 1 s")
    assert a["errors"][0]["class"] == "timeout"


async def test_timeout_override_is_capped(pool: asyncpg.Pool, db_url: str, workspace: UUID) -> None:
    async def slow(ctx: JobContext, payload: Any) -> None:
        await asyncio.sleep(30)

    job_id = await _insert(pool, workspace, "slow", timeout_s=3600)
    await run_burst(pool, db_url, Registry([job_type("slow", slow)]), max_timeout_s=0.3)
    assert (await _job(pool, job_id))["error_msg"] == "timed out after 0.3 s"


async def test_each_error_class(pool: asyncpg.Pool, db_url: str, workspace: UUID) -> None:
    async def outcome(ctx: JobContext, payload: Any) -> Any:
        kind = payload.model_dump()["kind"]
        if kind == "retry_after":
            raise RetryJob("429 Too Many Requests", after_s=7)
        if kind == "permanent":
            raise PermanentError("401: the key was refused")
        if kind == "defer":
            raise Defer("a LiveKit room is live", after_s=300)
        if kind == "bug":
            raise KeyError("oops")
        return {"ok": True}

    registry = Registry([job_type("outcome", outcome)])
    ids = {
        k: await _insert(pool, workspace, "outcome", f'{{"kind": "{k}"}}')
        for k in ("ok", "retry_after", "permanent", "defer", "bug")
    }
    await run_burst(pool, db_url, registry)
    rows = {k: await _job(pool, i) for k, i in ids.items()}
    assert (rows["ok"]["status"], rows["ok"]["result"]) == ("completed", {"ok": True})
    retry = rows["retry_after"]
    assert retry["status"] == "retry" and retry["errors"][0]["class"] == "transient"
    wait = retry["scheduled_for"] - datetime.fromisoformat(retry["errors"][0]["at"])
    assert wait == timedelta(seconds=7)  # the service's Retry-After, not the 30 s backoff
    assert (rows["permanent"]["status"], rows["permanent"]["attempts"]) == ("error", 1)
    assert rows["permanent"]["error_msg"] == "401: the key was refused"
    deferred = rows["defer"]
    assert (deferred["status"], deferred["attempts"], deferred["errors"]) == ("pending", 0, [])
    assert deferred["scheduled_for"] > datetime.now(UTC) + timedelta(seconds=290)
    assert rows["bug"]["status"] == "retry" and rows["bug"]["error_msg"] == "KeyError: 'oops'"


async def test_bad_payload_fails_permanently_naming_the_field(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    class Clip(BaseModel):
        text: str
        source_url: str | None = None

    async def clip(ctx: JobContext, payload: Clip) -> str:
        raise AssertionError("the handler must not run on a bad payload")

    registry = Registry([job_type("clip", clip, payload_model=Clip)])
    missing = await _insert(pool, workspace, "clip", '{"source_url": "https://x"}')
    not_object = await _insert(pool, workspace, "clip", '["text"]')
    await run_burst(pool, db_url, registry)
    a, b = await _job(pool, missing), await _job(pool, not_object)
    assert (a["status"], a["attempts"]) == ("error", 1)
    assert a["error_msg"] == "invalid payload: text: Field required"
    assert b["error_msg"] == "invalid payload: expected a JSON object, got list"


async def test_duplicate_unique_keys_enqueued_concurrently(
    pool: asyncpg.Pool, workspace: UUID
) -> None:
    async def enqueue_one() -> UUID:
        async with pool.acquire() as conn, conn.transaction():
            return await client.enqueue(
                conn, workspace, "noop", {}, unique_key="stats_parse:2026-12-02T10"
            )

    ids = await asyncio.gather(*(enqueue_one() for _ in range(6)))
    assert len(set(ids)) == 1
    assert await pool.fetchval("SELECT count(*) FROM job_queue") == 1
    # The rule is the index's, so it holds for plain SQL too; a finished job frees the key.
    try:
        await _insert(pool, workspace, "noop", unique_key="stats_parse:2026-12-02T10")
        raise AssertionError("a duplicate plain-SQL insert must fail")
    except asyncpg.UniqueViolationError:
        pass
    await pool.execute("UPDATE job_queue SET status = 'completed'")
    again = await client.enqueue(
        pool, workspace, "noop", {}, unique_key="stats_parse:2026-12-02T10"
    )
    assert again != ids[0]


async def test_cancel_a_pending_job(pool: asyncpg.Pool, db_url: str, workspace: UUID) -> None:
    job_id = await _insert(pool, workspace, "noop")
    out = cli("jobs", "cancel", str(job_id), url=db_url)
    assert out.returncode == 0 and out.stdout.strip() == "cancelled"
    await run_burst(pool, db_url)
    assert (await _job(pool, job_id))["status"] == "cancelled"
    again = cli("jobs", "cancel", str(job_id), url=db_url)
    assert again.returncode != 0 and "already cancelled" in again.stderr


async def test_cancel_a_running_job_stops_its_handler(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    started = asyncio.Event()
    stopped = []

    async def long(ctx: JobContext, payload: Any) -> None:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            stopped.append(ctx.job_id)
            raise

    job_id = await _insert(pool, workspace, "long")
    worker = Worker(
        pool,
        db_url,
        Registry([job_type("long", long)]),
        WorkerSettings(burst=True, poll_interval_s=0.05),
    )
    task = asyncio.create_task(worker.run())
    await asyncio.wait_for(started.wait(), 10)
    out = await asyncio.to_thread(cli, "jobs", "cancel", str(job_id), url=db_url)
    assert out.returncode == 0 and "being stopped" in out.stdout
    await asyncio.wait_for(task, 10)
    row = await _job(pool, job_id)
    assert stopped == [job_id]
    assert (row["status"], row["errors"][-1]["class"]) == ("cancelled", "cancelled")


async def test_cancel_by_plain_sql_reaches_the_worker_by_heartbeat(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    started = asyncio.Event()

    async def long(ctx: JobContext, payload: Any) -> None:
        started.set()
        await asyncio.sleep(60)

    job_id = await _insert(pool, workspace, "long")
    worker = Worker(
        pool,
        db_url,
        Registry([job_type("long", long)]),
        WorkerSettings(burst=True, poll_interval_s=0.05, lease_s=0.6, listen=False),
    )
    task = asyncio.create_task(worker.run())
    await asyncio.wait_for(started.wait(), 10)
    await pool.execute("UPDATE job_queue SET cancel_requested_at = now() WHERE id = $1", job_id)
    await asyncio.wait_for(task, 10)
    assert (await _job(pool, job_id))["status"] == "cancelled"


async def test_no_listen_still_runs_jobs_by_polling(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    async with running_worker(
        pool, db_url, Registry([job_type("noop", _echo)]), poll_interval_s=0.05, listen=False
    ):
        job_id = await _insert(pool, workspace, "noop")
        await wait_for_sql(
            pool, "SELECT status = 'completed' FROM job_queue WHERE id = $1", job_id, timeout_s=10
        )
        assert not await pool.fetchval(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE query LIKE 'LISTEN%' AND datname = current_database()"
        )


async def test_retention_prunes_old_finished_jobs_in_batches(
    pool: asyncpg.Pool, workspace: UUID
) -> None:
    await pool.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload, status, completed_at)"
        " SELECT $1, 'noop', '{}', s::job_status, now() - make_interval(days => d)"
        " FROM unnest(ARRAY['completed','completed','error','error','cancelled','pending']::text[],"
        "             ARRAY[20, 1, 20, 100, 20, 20]) AS t(s, d)",
        workspace,
    )
    deleted = (await store.prune(pool, 14 * 86400, 90 * 86400, batch=2))[0]
    deleted += (await store.prune(pool, 14 * 86400, 90 * 86400, batch=2))[0]
    assert deleted == 3
    left = await pool.fetch(
        "SELECT status::text, extract(day FROM now() - completed_at)::int AS age"
        " FROM job_queue ORDER BY 1, 2"
    )
    assert [tuple(r) for r in left] == [("completed", 1), ("error", 20), ("pending", 20)]
    assert await statuses(pool) == {"completed": 1, "error": 1, "pending": 1}


@pytest.mark.parametrize("in_graph", [False, True], ids=["alone", "in a graph"])
async def test_a_job_put_back_while_the_prune_deletes_it_stays(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, in_graph: bool
) -> None:
    """A failed job past retention, retried by a writer while the prune (whose snapshot saw it
    failed) deletes it: the prune waited for the retry's lock, then deleted the job the
    retry had just put back in the queue, as it matched its ids alone. A job put back stays."""
    old = "now() - interval '100 days'"
    job = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload, status, completed_at)"
        f" VALUES ($1, 'noop', '{{}}', 'error', {old}) RETURNING id",
        workspace,
    )
    if in_graph:  # a finished parent: the graph goes whole or stays whole
        parent = await pool.fetchval(
            "INSERT INTO job_queue (workspace_id, job_type, payload, status, completed_at,"
            f" created_at) VALUES ($1, 'noop', '{{}}', 'completed', {old}, {old}) RETURNING id",
            workspace,
        )
        await pool.execute(
            "INSERT INTO job_dependencies (parent_id, child_id) VALUES ($1, $2)", parent, job
        )
    writer, pruner = await asyncpg.connect(db_url), await asyncpg.connect(db_url)
    try:
        retry = writer.transaction()
        await retry.start()
        await writer.execute(
            "UPDATE job_queue SET status = 'pending', attempts = 0, scheduled_for = now()"
            " WHERE id = $1",
            job,
        )
        pruning = asyncio.create_task(store.prune(pruner, 14 * 86400, 90 * 86400, batch=100))
        await wait_for_sql(
            pool,
            "SELECT count(*) > 0 FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'",
            pruner.get_server_pid(),
        )
        await retry.commit()
        await pruning
    finally:
        await writer.close()
        await pruner.close()
    assert await pool.fetchval("SELECT status::text FROM job_queue WHERE id = $1", job) == (
        "pending"
    )


async def _echo(ctx: JobContext, payload: Any) -> Any:
    return payload.model_dump()
