"""Notifications are hints, never commands: a login role with no rights at all may NOTIFY any
channel the workers listen on, with any payload, and no job changes state because of it."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any
from urllib.parse import urlsplit
from uuid import UUID, uuid4

import asyncpg
import pytest

from sidelinja_worker.queue import store
from sidelinja_worker.queue.cancels import CANCEL_RECHECK_S
from sidelinja_worker.queue.context import JobContext
from sidelinja_worker.queue.jobs import ClaimedJob
from sidelinja_worker.queue.limits import RELOAD_MIN_S, LimitsCache
from sidelinja_worker.queue.listener import CANCEL_CHANNEL, DUE_CHANNEL, LIMITS_CHANNEL, Listener
from sidelinja_worker.queue.prefetch import PREFETCH_MAX
from sidelinja_worker.queue.registry import Registry
from sidelinja_worker.queue.settings import WorkerSettings
from sidelinja_worker.queue.worker import EMPTY_CLAIM_GAP_S, Worker
from tests.helpers import job_type, running_worker, wait_for, wait_for_sql

EVENTS_CHANNEL = "sidelinja_job_events"


async def test_notifications_from_a_role_with_no_rights_change_no_job(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    role = f"nobody_{uuid4().hex[:10]}"
    await pool.execute(f'CREATE ROLE "{role}" LOGIN')
    release = asyncio.Event()
    started: list[UUID] = []

    async def long(ctx: JobContext, payload: Any) -> dict[str, str]:
        started.append(ctx.job_id)
        await release.wait()
        return {"done": "yes"}

    running = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload) VALUES ($1, 'long', '{}')"
        " RETURNING id",
        workspace,
    )
    later = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload, scheduled_for)"
        " VALUES ($1, 'long', '{}', now() + interval '1 hour') RETURNING id",
        workspace,
    )
    worker = Worker(
        pool,
        db_url,
        Registry([job_type("long", long)]),
        WorkerSettings(poll_interval_s=0.05, max_concurrent=2, burst=True),
    )
    seen: list[UUID] = []
    hint = worker._on_cancel_notice

    def counting(job_id: UUID) -> None:
        seen.append(job_id)
        hint(job_id)

    worker._on_cancel_notice = counting  # type: ignore[method-assign]
    task = asyncio.create_task(worker.run())
    evil = None
    try:
        await wait_for(lambda: started)
        limits_before = worker._limits.current
        user = urlsplit(db_url)._replace(netloc=f"{role}@{urlsplit(db_url).netloc.split('@')[-1]}")
        evil = await asyncpg.connect(user.geturl())

        async def heard() -> bool:
            # The listener starts beside the first claim: a job can run before its LISTEN is
            # up, and a notification sent before then is gone. Hints are repeated until one lands.
            await evil.execute("SELECT pg_notify($1, $2)", CANCEL_CHANNEL, str(running))
            return running in seen

        await wait_for(heard)
        seen.clear()
        payloads = [
            str(running),
            str(later),
            str(uuid4()),
            "",
            "not a uuid",
            "x" * 7000,
            f'{{"id": "{running}", "status": "cancelled"}}',
        ]
        for channel in (CANCEL_CHANNEL, DUE_CHANNEL, LIMITS_CHANNEL, EVENTS_CHANNEL):
            for body in payloads:
                await evil.execute("SELECT pg_notify($1, $2)", channel, body)
        # The worker has taken the hint for its running job, and looked at its row.
        await wait_for(lambda: running in seen and not worker._cancel_notices.checking)
        assert worker._limits.current == limits_before
        release.set()
        await asyncio.wait_for(task, 20)
    finally:
        release.set()
        if evil is not None:
            await evil.close()
        await pool.execute(f'DROP ROLE "{role}"')
    a = await store.get_job(pool, running)
    b = await store.get_job(pool, later)
    assert a is not None and b is not None
    assert (a["status"], a["cancel_requested_at"]) == ("completed", None)
    assert (b["status"], b["attempts"]) == ("pending", 0)


class CountingLimits(LimitsCache):
    """The worker's limits cache, counting its reads of the limit tables."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        super().__init__(pool)
        self.loads = 0

    async def load(self) -> None:
        self.loads += 1
        await super().load()


async def test_a_stream_of_limit_notifications_rereads_the_limits_a_few_times_a_second(
    pool: asyncpg.Pool, db_url: str
) -> None:
    """Any role may NOTIFY the limits channel as fast as it likes. Each notification made the
    worker read the limit tables again, back to back: thousands of queries a second from every
    worker. A change still applies at once; a stream of them is read a few times a second."""
    cache = CountingLimits(pool)
    listener = Listener(db_url, lambda: None, lambda _job_id: None, cache.changed)
    tasks = [asyncio.create_task(cache.run()), asyncio.create_task(listener.run())]
    sender = await asyncpg.connect(db_url)
    try:
        await asyncio.wait_for(listener.connected.wait(), 10)
        await pool.execute("INSERT INTO job_type_limits (job_type, max_running) VALUES ('a', 1)")
        await wait_for(lambda: cache.current.type_caps == {"a": 1})
        loop = asyncio.get_running_loop()
        before, started = cache.loads, loop.time()
        while loop.time() - started < 1.0:
            await sender.execute(f"NOTIFY {LIMITS_CHANNEL}")
        assert cache.loads - before <= 1.0 / RELOAD_MIN_S + 3
        await pool.execute("UPDATE job_type_limits SET max_running = 2")
        await wait_for(lambda: cache.current.type_caps == {"a": 2})
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await sender.close()


async def _flood(sender: asyncpg.Connection, channel: str, payload: str, seconds: float) -> float:
    """Notifications on `channel` back to back for `seconds`; returns the time taken."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    while loop.time() - started < seconds:
        await sender.execute("SELECT pg_notify($1, $2)", channel, payload)
    return loop.time() - started


async def test_a_stream_of_wake_ups_makes_at_most_a_few_hundred_empty_claims_a_second(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """Any role may NOTIFY the wake-up channel as fast as it likes: each notification made an
    idle worker claim again, ~1,800 empty claims a second. After an empty claim the next waits
    EMPTY_CLAIM_GAP_S; a job inserted after the stream is still picked up at once."""
    async with running_worker(pool, db_url, poll_interval_s=60.0) as worker:
        sender = await asyncpg.connect(db_url)
        try:

            async def heard() -> bool:  # the listener connects beside the first claim
                before = worker.claims_made
                await sender.execute(f"NOTIFY {DUE_CHANNEL}")
                await asyncio.sleep(0.05)
                return worker.claims_made > before

            await wait_for(heard)
            before = worker.claims_made
            took_s = await _flood(sender, DUE_CHANNEL, "", 1.0)
            assert worker.claims_made - before <= took_s / EMPTY_CLAIM_GAP_S + 5
        finally:
            await sender.close()
        job = await pool.fetchval(
            "INSERT INTO job_queue (workspace_id, job_type, payload) VALUES ($1, 'noop', '{}')"
            " RETURNING id",
            workspace,
        )
        await wait_for_sql(pool, "SELECT status = 'completed' FROM job_queue WHERE id = $1", job)


async def test_a_stream_of_cancel_notices_reads_the_row_a_few_times_a_second_and_misses_none(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each cancel notice for a job the worker runs made it read the job's row, back to back
    while notices kept coming. A stream now costs a read per CANCEL_RECHECK_S, and a real
    cancel request inside the stream still cancels the job at once."""
    started = asyncio.Event()
    reads = 0
    real_read = store.cancel_requested

    async def counted(*args: Any) -> bool:
        nonlocal reads
        reads += 1
        return await real_read(*args)

    monkeypatch.setattr(store, "cancel_requested", counted)

    async def long(ctx: JobContext, payload: Any) -> dict[str, str]:
        started.set()
        await asyncio.Event().wait()  # until cancelled
        return {}

    job = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload) VALUES ($1, 'long', '{}')"
        " RETURNING id",
        workspace,
    )
    registry = Registry([job_type("long", long)])
    async with running_worker(pool, db_url, registry, poll_interval_s=60.0):
        await asyncio.wait_for(started.wait(), 20)
        sender = await asyncpg.connect(db_url)
        try:

            async def heard() -> bool:
                await sender.execute("SELECT pg_notify($1, $2)", CANCEL_CHANNEL, str(job))
                await asyncio.sleep(0.05)
                return reads > 0

            await wait_for(heard)
            before = reads
            took_s = await _flood(sender, CANCEL_CHANNEL, str(job), 1.0)
            assert reads - before <= took_s / CANCEL_RECHECK_S + 3
            stream = asyncio.create_task(_flood(sender, CANCEL_CHANNEL, str(job), 0.5))
            await store.request_cancel(pool, job)
            await stream
        finally:
            await sender.close()
        await wait_for_sql(
            pool, "SELECT status = 'cancelled' FROM job_queue WHERE id = $1", job, timeout_s=5
        )


async def test_a_stream_of_junk_cancel_notices_writes_no_log_line_of_its_own(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Any role may NOTIFY the cancel channel with 8,000 bytes of anything, as fast as it
    likes. Each notice that named no job was a warning holding the whole payload: a second of
    them from one client wrote megabytes of log lines, formatted on the worker's event loop.
    Such a notice is no news for an operator: a debug line, its payload cut short."""
    named: list[UUID] = []
    listener = Listener(db_url, lambda: None, named.append, lambda: None)
    task = asyncio.create_task(listener.run())
    sender = await asyncpg.connect(db_url)
    try:
        await asyncio.wait_for(listener.connected.wait(), 10)
        caplog.set_level(logging.INFO, logger="sidelinja_worker.listener")
        await _flood(sender, CANCEL_CHANNEL, "x" * 7900, 1.0)
        job = uuid4()
        await sender.execute("SELECT pg_notify($1, $2)", CANCEL_CHANNEL, str(job))
        await wait_for(lambda: named == [job])  # every junk notice before it has been read
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await sender.close()
    assert [r.getMessage()[:80] for r in caplog.records] == []


async def test_a_cancel_notice_costs_the_same_however_many_jobs_the_worker_holds(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """A worker draining short jobs holds up to 4,000 claimed ahead. Each cancel notice looked
    for its job among them, one by one: 0.45 ms a notice, so one statement of any role sending
    100,000 notices with made-up ids (`SELECT pg_notify(...) FROM generate_series(...)`) held
    the event loop of every worker for 45 s. A notice is looked up among the running jobs only;
    a job claimed ahead that a row asks to cancel is cancelled by the heartbeat's look at the
    rows."""
    worker = Worker(pool, db_url, Registry([]), WorkerSettings())
    worker._ready.extend(
        ClaimedJob(uuid4(), workspace, "noop", {}, 0, 1, 3, None) for _ in range(PREFETCH_MAX)
    )
    notices = [uuid4() for _ in range(20_000)]
    started = time.perf_counter()
    for job_id in notices:
        worker._on_cancel_notice(job_id)
    assert time.perf_counter() - started < 1.0  # 9 s here before
    assert not worker._cancel_notices.checking
