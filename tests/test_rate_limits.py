"""Rate limits shared by every worker, checked at a real HTTP server that counts the calls."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from uuid import UUID

import asyncpg
import pytest

from sidelinja_worker.queue import store
from sidelinja_worker.queue.config import ServiceConfig
from sidelinja_worker.queue.context import JobContext
from sidelinja_worker.queue.db import create_pool
from sidelinja_worker.queue.errors import Defer, RetryJob
from sidelinja_worker.queue.limits import RateLimiter
from sidelinja_worker.queue.registry import Registry
from sidelinja_worker.queue.settings import WorkerSettings
from sidelinja_worker.queue.worker import Worker
from tests.helpers import insert_jobs, job_type, wait_for_sql


class CountingServer:
    """Answers 200, or 429 with Retry-After for the first `fail_first` calls; logs arrivals."""

    def __init__(self, fail_first: int = 0, retry_after_s: int = 2) -> None:
        self.arrivals: list[tuple[float, int]] = []
        self._fail_first = fail_first
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with lock:
                    status = 429 if len(outer.arrivals) < outer._fail_first else 200
                    outer.arrivals.append((time.monotonic(), status))
                self.send_response(status)
                if status == 429:
                    self.send_header("Retry-After", str(retry_after_s))
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args: Any) -> None:
                pass

        lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        """Stops serving and closes the listening socket (shutdown alone leaves it open)."""
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[CountingServer]:
    s = CountingServer()
    yield s
    s.close()


def _calling(url: str, key: str, log: dict[str, list[float]] | None = None) -> JobType_:
    """A job type that asks the limiter, then calls `url`; `log` gets the moments each call was
    let through ("granted") and each 429 pause was recorded ("paused")."""
    log = log if log is not None else {}

    async def call(ctx: JobContext, payload: Any) -> int:
        await ctx.services.limiter.acquire(key)
        log.setdefault("granted", []).append(time.monotonic())
        response = await ctx.services.http.get(url, timeout=10)
        if response.status_code == 429:
            after = float(response.headers["Retry-After"])
            await ctx.services.limiter.pause(key, after)
            log.setdefault("paused", []).append(time.monotonic())
            raise RetryJob("429 Too Many Requests", after_s=after)
        return response.status_code

    return job_type("call", call)


JobType_ = Any


async def _run_workers(db_url: str, registry: Registry, until: Any, count: int = 3) -> None:
    """`count` independent workers (each with its own pool), until `until()` is true."""
    pools = [await create_pool(db_url, max_size=5) for _ in range(count)]
    workers = [
        Worker(
            p,
            db_url,
            registry,
            WorkerSettings(max_concurrent=10, poll_interval_s=0.1),
            ServiceConfig({}),
        )
        for p in pools
    ]
    tasks = [asyncio.create_task(w.run()) for w in workers]
    try:
        await until()
    finally:
        for w in workers:
            w.request_stop()
        await asyncio.gather(*tasks)
        for p in pools:
            await p.close()


async def _all_done(pool: asyncpg.Pool, n: int, timeout_s: float) -> None:
    await wait_for_sql(
        pool,
        "SELECT count(*) >= $1 FROM job_queue WHERE status = 'completed'",
        n,
        timeout_s=timeout_s,
    )


# The window the limit below counts in: a minute's limit behaves as this one, in a quarter of
# the time (the test waits one window).
WINDOW_S = 15.0


@pytest.mark.timeout(120)
async def test_twenty_per_window_across_three_workers(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, server: CountingServer
) -> None:
    await store.set_rate_limit(pool, "svc", 20, WINDOW_S)
    await insert_jobs(pool, workspace, 25, job_type_name="call")
    registry = Registry([_calling(server.url, "svc")])
    await _run_workers(db_url, registry, lambda: _all_done(pool, 25, 90))
    times = sorted(t for t, _ in server.arrivals)
    assert len(times) == 25
    for i, start in enumerate(times):  # no 21st call inside any window
        assert sum(1 for t in times[i:] if t - start < WINDOW_S) <= 20
    assert times[-1] - times[0] >= WINDOW_S
    # The waiting jobs were deferred (not a failed attempt), not held in a slot or failed.
    assert await pool.fetchval("SELECT max(attempts) FROM job_queue") == 1


async def test_a_429_pauses_every_worker(pool: asyncpg.Pool, db_url: str, workspace: UUID) -> None:
    server = CountingServer(fail_first=1, retry_after_s=2)
    log: dict[str, list[float]] = {}
    try:
        await insert_jobs(pool, workspace, 30, job_type_name="call")
        registry = Registry([_calling(server.url, "svc429", log)])
        await _run_workers(db_url, registry, lambda: _all_done(pool, 30, 60))
    finally:
        server.close()
    assert sorted(server.arrivals)[0][1] == 429 and len(log["paused"]) == 1
    paused = log["paused"][0]
    # Once the pause is recorded, no worker lets a call through for the 2 s of Retry-After
    # (a look at the limiter already under way when the pause committed may still pass).
    inside = [round(t - paused, 3) for t in log["granted"] if 0.3 < t - paused < 1.75]
    assert not inside, inside
    assert any(t - paused >= 1.75 for t in log["granted"])  # and the calls resume after it


async def test_a_pause_until_infinity_defers_its_calls_and_leaves_every_limit_readable(
    pool: asyncpg.Pool,
) -> None:
    """An operator may pause a service until further notice by plain SQL (`paused_until =
    'infinity'`). Subtracting the clock from it failed every worker's `limits` query, so no
    worker could read the caps it must count, and every call to that service failed its job.
    It now reads as a pause of a year: the caps load, and a call defers its job."""
    await pool.execute(
        "INSERT INTO rate_limits (key, paused_until)"
        " VALUES ('forever', 'infinity'), ('never', '-infinity')"
    )
    await pool.execute("INSERT INTO job_type_limits (job_type, max_running) VALUES ('noop', 3)")
    year_s = 365 * 86400
    limits = await store.limits(pool)
    assert limits.type_caps == {"noop": 3}
    granted, wait_s = await store.rate_acquire(pool, "forever", 0.5)
    assert not granted and year_s - 60 <= wait_s <= year_s + 86400
    assert (await store.rate_acquire(pool, "never", 0.5))[0]
    with pytest.raises(Defer):
        await RateLimiter(pool).acquire("forever")


async def test_a_window_no_interval_holds_counts_as_366_days(pool: asyncpg.Pool) -> None:
    """`per_s` is a float a plain-SQL writer can set to 'Infinity', 'NaN' or 1e300 (the table's
    check lets them through): no interval holds them, and every call to the service failed its
    job. Such a window counts as 366 days: the first call is granted, the next deferred. So
    does a grant time of 'infinity' in `recent`, which failed the wait's arithmetic."""
    await pool.execute(
        "INSERT INTO rate_limits (key, max_requests, per_s)"
        " VALUES ('inf', 1, 'Infinity'), ('nan', 1, 'NaN'), ('huge', 1, 1e300)"
    )
    for key in ("inf", "nan", "huge"):
        assert (await store.rate_acquire(pool, key, 0.5))[0], key
        granted, wait_s = await store.rate_acquire(pool, key, 0.5)
        assert not granted and 365 * 86400 < wait_s <= 366 * 86400 + 1, (key, wait_s)
        with pytest.raises(Defer):
            await RateLimiter(pool).acquire(key)
    # A grant time that is not finite is no grant: it neither fills the window nor breaks it.
    await pool.execute(
        "INSERT INTO rate_limits (key, max_requests, per_s, recent)"
        " VALUES ('odd', 1, 60, ARRAY['infinity', '-infinity']::timestamptz[])"
    )
    assert (await store.rate_acquire(pool, "odd", 0.5))[0]
    granted, wait_s = await store.rate_acquire(pool, "odd", 0.5)
    assert not granted and 59 < wait_s <= 61


async def test_a_grant_time_in_the_future_is_no_grant(pool: asyncpg.Pool) -> None:
    """Grants are recorded at the database's clock, so one later than that clock says the clock
    went back (a corrected jump ahead) or was written by SQL. Counted, it filled the window until
    that time plus the window: a service was deferred week after week, every job calling it."""
    await pool.execute(
        "INSERT INTO rate_limits (key, max_requests, per_s, recent)"
        " VALUES ('ahead', 2, 60, ARRAY[now() + interval '30 days', now() + interval '1 hour'])"
    )
    assert (await store.rate_acquire(pool, "ahead", 0.5))[0]
    assert (await store.rate_acquire(pool, "ahead", 0.5))[0]
    granted, wait_s = await store.rate_acquire(pool, "ahead", 0.5)
    assert not granted and 59 < wait_s <= 61
