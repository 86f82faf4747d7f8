"""Worker metrics in Prometheus format (`run --metrics-port`): in-process counters and
histograms fed by one-line hooks, the event loop's lag, and queue gauges refreshed from the
database by one task every GAUGE_REFRESH_S, so a scrape (or a flood of them) never runs a query:
it answers from that cache."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from bisect import bisect_left
from collections.abc import Iterator
from contextvars import ContextVar
from itertools import accumulate
from uuid import UUID

import asyncpg
from prometheus_client import REGISTRY, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from sidelinja_worker.queue import clock, store
from sidelinja_worker.queue.db import DB_ERRORS

log = logging.getLogger("sidelinja_worker.metrics")

RUN_BOUNDS_S = (0.001, 0.01, 0.1, 0.5, 1.0, 5.0, 30.0, 120.0, 600.0, 3600.0)
PICKUP_BOUNDS_S = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 120.0, 600.0)
JOBS = Gauge("sidelinja_jobs", "Jobs in the queue by status and type", ["status", "job_type"])
OLDEST_DUE = Gauge("sidelinja_oldest_due_job_age_seconds", "Age of the oldest due waiting job")
LOOP_LAG = Gauge(
    "sidelinja_event_loop_lag_seconds",
    "How late the worker's event loop ran a timer, last measured (a blocking handler shows here)",
)
NOTIFY_USAGE = Gauge(
    "sidelinja_notify_queue_usage",
    "Fraction of PostgreSQL's notification queue in use, cluster-wide (above a few percent: a"
    " LISTENing session stopped reading)",
)
NOTIFY_PAUSED = Gauge(
    "sidelinja_notify_paused",
    "1 while job writes skip a kind of notification because the notification queue is full"
    " enough (job_events: status events; wakeups: new-job wake-ups, workers then poll)",
    ["kind"],
)
GAUGES_AGE = Gauge(
    "sidelinja_queue_gauges_age_seconds", "Seconds since the queue gauges were last refreshed"
)
GAUGE_REFRESH_S = 5.0  # the queue gauges are at most this old (plus one query)
REQUEST_TIMEOUT_S = 5.0  # a client that has not sent its request by then is dropped
DEFAULT_HOST = "127.0.0.1"  # not reachable from other machines unless asked for


class _TypeStats:
    """Plain numbers per job type. The hooks run on the event loop and so does the scrape, so no
    lock is needed; prometheus_client's own Histogram.observe costs 2-5 µs, these well under 1."""

    __slots__ = ("completed", "failed", "pickup_counts", "pickup_sum", "run_counts", "run_sum")

    def __init__(self) -> None:
        self.completed = self.failed = 0
        self.run_sum = self.pickup_sum = 0.0
        self.run_counts = [0] * (len(RUN_BOUNDS_S) + 1)
        self.pickup_counts = [0] * (len(PICKUP_BOUNDS_S) + 1)


_STATS: dict[str, _TypeStats] = {}


def _stats(job_type: str) -> _TypeStats:
    stats = _STATS.get(job_type)
    if stats is None:
        stats = _STATS[job_type] = _TypeStats()
    return stats


def completed(job_type: str, run_s: float) -> None:
    """Hook: a handler returned after `run_s` seconds."""
    stats = _STATS.get(job_type) or _stats(job_type)
    stats.completed += 1
    stats.run_sum += run_s
    stats.run_counts[bisect_left(RUN_BOUNDS_S, run_s)] += 1
    _minute(True, run_s)


def failed(job_type: str) -> None:
    """Hook: an attempt failed (to be retried or for good)."""
    (_STATS.get(job_type) or _stats(job_type)).failed += 1
    _minute(False, None)


# -- per-minute aggregates for the dashboard (table job_minute_stats) -----------------------

# Run-time buckets of job_minute_stats.run_buckets: counts of runs up to each bound, and one
# more for longer runs. Fine enough for a p50/p95 within a factor of ~2.
MINUTE_BOUNDS_S = (
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
    10.0, 20.0, 50.0, 100.0, 300.0, 1000.0, 3600.0,
)  # fmt: skip
MINUTE_FLUSH_S = 5.0
ALL_WORKSPACES = UUID(int=0)  # job_minute_stats' rows for the whole queue
MINUTE_ERRORS = (*DB_ERRORS, asyncpg.PostgresError)
MINUTE_KEEP_S = 2 * 86400.0
# Rows kept for a later flush while writing them fails, at most: a write refused for good (a
# trigger or a revoked privilege on the table) kept every minute's rows for ever, one per
# minute, workspace and type, and the worker's memory grew by gigabytes a day on a busy queue.
MINUTE_PENDING_MAX = 50_000
MINUTE_WARN_EVERY_S = 600.0  # a flush refused by PostgreSQL is logged at most this often
# The job a slot task runs, set by the worker around each job: the hooks above know the job
# type only, and each slot is its own task, so its own context.
CURRENT_JOB: ContextVar[tuple[UUID, str] | None] = ContextVar("current_job", default=None)
# (minute start, workspace, job type) -> [completed, failed, bucket counts...]
_MINUTES: dict[tuple[float, UUID, str], list[int]] = {}


def _minute(ok: bool, run_s: float | None) -> None:
    job = CURRENT_JOB.get()
    if job is None:
        return
    key = (clock.time() // 60 * 60, job[0], job[1])  # the database's minute, as the charts'
    row = _MINUTES.get(key)
    if row is None:
        row = _MINUTES[key] = [0] * (3 + len(MINUTE_BOUNDS_S))
    row[0 if ok else 1] += 1
    if run_s is not None:
        row[2 + bisect_left(MINUTE_BOUNDS_S, run_s)] += 1


async def flush_minutes(pool: asyncpg.Pool) -> None:
    """Adds the counts gathered since the last flush to job_minute_stats (one statement); on a
    database error they are kept for the next flush."""
    if not _MINUTES:
        return
    rows = list(_MINUTES.items())
    _MINUTES.clear()
    totals: dict[tuple[float, UUID, str], list[int]] = {}
    for (minute, _ws, job_type), counts in rows:  # the whole queue's, under the nil workspace
        total = totals.setdefault((minute, ALL_WORKSPACES, job_type), [0] * len(counts))
        total[:] = [a + b for a, b in zip(total, counts, strict=True)]
    try:
        await store.add_minute_stats(pool, [(*k, *v) for k, v in (*rows, *totals.items())])
    except MINUTE_ERRORS:
        for key, counts in rows:  # back, merged with whatever arrived meanwhile
            row = _MINUTES.setdefault(key, [0] * len(counts))
            row[:] = [a + b for a, b in zip(row, counts, strict=True)]
        _bound_pending()
        raise


def _bound_pending() -> None:
    """Keeps the newest MINUTE_PENDING_MAX rows of minutes within MINUTE_KEEP_S (the prune
    deletes older ones) and drops the rest."""
    oldest = clock.time() - MINUTE_KEEP_S
    for place, key in enumerate(sorted(_MINUTES, key=lambda k: k[0], reverse=True)):
        if place >= MINUTE_PENDING_MAX or key[0] < oldest:
            del _MINUTES[key]


async def minute_loop(pool: asyncpg.Pool, every_s: float = MINUTE_FLUSH_S) -> None:
    """Writes the per-minute aggregates every `every_s`, and drops those past MINUTE_KEEP_S
    once an hour."""
    last_prune = 0.0
    warned = -math.inf
    while True:
        await asyncio.sleep(every_s)
        try:
            await flush_minutes(pool)
            if time.monotonic() - last_prune > 3600:
                await store.prune_minute_stats(pool, MINUTE_KEEP_S)
                last_prune = time.monotonic()
        except DB_ERRORS as exc:  # the charts lag; the worker goes on
            log.debug("minute stats not written yet: %s", exc)
        except asyncpg.PostgresError as exc:  # refused: said, for it may never pass
            if time.monotonic() - warned >= MINUTE_WARN_EVERY_S:
                warned = time.monotonic()
                log.warning(
                    "the dashboard's minute stats cannot be written (%d rows kept, at most %d): %s",
                    len(_MINUTES),
                    MINUTE_PENDING_MAX,
                    exc,
                )


def picked_up(job_type: str, waited_s: float) -> None:
    """Hook: a job was claimed `waited_s` after it became due."""
    stats = _STATS.get(job_type) or _stats(job_type)
    stats.pickup_sum += waited_s
    stats.pickup_counts[bisect_left(PICKUP_BOUNDS_S, waited_s)] += 1


def _buckets(bounds: tuple[float, ...], counts: list[int]) -> list[tuple[str, float]]:
    cumulative = list(accumulate(counts))
    return [(str(b), float(c)) for b, c in zip(bounds, cumulative, strict=False)] + [
        ("+Inf", float(cumulative[-1]))
    ]


class _WorkerCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        processed = CounterMetricFamily(
            "sidelinja_jobs_processed", "Attempts finished here", labels=["job_type", "outcome"]
        )
        run = HistogramMetricFamily(
            "sidelinja_job_run_seconds", "Handler run time", labels=["job_type"]
        )
        pickup = HistogramMetricFamily(
            "sidelinja_job_pickup_latency_seconds",
            "From due (scheduled_for) to claimed",
            labels=["job_type"],
        )
        for job_type, s in sorted(_STATS.items()):
            processed.add_metric([job_type, "completed"], s.completed)
            processed.add_metric([job_type, "failed"], s.failed)
            run.add_metric([job_type], _buckets(RUN_BOUNDS_S, s.run_counts), s.run_sum)
            pickup.add_metric([job_type], _buckets(PICKUP_BOUNDS_S, s.pickup_counts), s.pickup_sum)
        yield from (processed, run, pickup)


REGISTRY.register(_WorkerCollector())


async def _refresh_gauges(pool: asyncpg.Pool) -> None:
    """Runs as the worker's own role: the worker's metrics cover every workspace."""
    async with pool.acquire() as conn:
        rows = await store.counts(conn)
        oldest = await store.oldest_due_s(conn) or 0.0
        notify = await store.notify_queue_state(conn)
    JOBS.clear()
    for row in rows:
        JOBS.labels(row["status"], row["job_type"] or store.OTHER_TYPES).set(row["n"])
    OLDEST_DUE.set(oldest)
    NOTIFY_USAGE.set(notify["usage"])
    NOTIFY_PAUSED.labels("job_events").set(notify["events_paused"])
    NOTIFY_PAUSED.labels("wakeups").set(notify["wakeups_paused"])


# A lag this long is said at warning: a handler blocked the loop (time.sleep, a blocking
# client, CPU work), and with it every job, claim and heartbeat. Only the gauge showed it, and
# the lease it cost was logged as a rescue that "took too long".
LOOP_BLOCKED_WARN_S = 1.0


async def lag_loop(tick_s: float) -> None:
    """Measures how late the event loop wakes a `tick_s` sleep: the lag every job's pickup and
    every heartbeat pays. Runs for the worker's life, supervised with its other tasks."""
    loop = asyncio.get_running_loop()
    while True:
        start = loop.time()
        await asyncio.sleep(tick_s)
        lag = max(loop.time() - start - tick_s, 0.0)
        LOOP_LAG.set(lag)
        if lag >= LOOP_BLOCKED_WARN_S:
            log.warning(
                "the event loop was blocked for %.1f s: every job, claim and heartbeat waited"
                " (a handler's blocking call belongs in a thread: asyncio.to_thread)",
                lag,
            )


async def gauge_loop(pool: asyncpg.Pool, every_s: float = GAUGE_REFRESH_S) -> None:
    """Refreshes the queue gauges every `every_s`: the only place the metrics query the
    database, whatever the number of scrapes."""
    loop = asyncio.get_running_loop()
    refreshed = loop.time()
    while True:
        try:
            await asyncio.wait_for(_refresh_gauges(pool), every_s)
            refreshed = loop.time()
        except (*DB_ERRORS, asyncpg.PostgresError) as exc:  # stale gauges beat none
            log.warning("metrics: queue gauges not refreshed (%s)", exc)
        GAUGES_AGE.set(loop.time() - refreshed)
        await asyncio.sleep(every_s)


async def serve(pool: asyncpg.Pool, port: int, host: str = DEFAULT_HOST) -> asyncio.Server:
    """A minimal HTTP server on the worker's own loop: any GET answers with the metrics, from
    memory; the gauges are read once now, then by `gauge_loop`. A client that sends no request
    within REQUEST_TIMEOUT_S, or does not read the answer within it, is dropped."""
    try:
        await asyncio.wait_for(_refresh_gauges(pool), REQUEST_TIMEOUT_S)
    except (*DB_ERRORS, asyncpg.PostgresError) as exc:
        log.warning("metrics: queue gauges not read yet (%s)", exc)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                await reader.readuntil(b"\r\n\r\n")
                body = generate_latest(REGISTRY)
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
                    b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body
                )
                await writer.drain()
        except (OSError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, host, port)
    log.info("metrics on http://%s:%d/metrics", host, port)
    return server
