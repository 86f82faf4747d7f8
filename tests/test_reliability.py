"""Nothing lost, nothing stuck: wake-up, leases and rescue, graceful stop, database faults."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from typing import Any
from uuid import UUID

import asyncpg
import pytest

from sidelinja_worker.queue.context import JobContext
from sidelinja_worker.queue.db import create_pool
from sidelinja_worker.queue.errors import UserError
from sidelinja_worker.queue.registry import Registry
from sidelinja_worker.queue.settings import WorkerSettings
from sidelinja_worker.queue.worker import Worker
from tests.admin_fixtures import free_port
from tests.helpers import (
    insert_jobs,
    job_type,
    kill_worker_connections,
    metrics_text,
    run_burst,
    running_worker,
    spawn,
    statuses,
    wait_for,
)

DONE = re.compile(r"job ([0-9a-f-]{36}) noop completed")


async def _jobs_started(port: int, n: int) -> bool:
    """Whether the worker serving /metrics on `port` has started `n` noop jobs: the count of its
    pickup histogram, which a slot adds to as it starts a job."""
    body = await metrics_text(port)
    if body is None:  # not serving yet
        return False
    found = re.search(
        r'^sidelinja_job_pickup_latency_seconds_count\{job_type="noop"\} (\S+)$', body, re.MULTILINE
    )
    return found is not None and float(found.group(1)) >= n


async def test_plain_sql_insert_wakes_an_idle_worker_at_once(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    async with running_worker(
        pool, db_url, Registry([job_type("noop", _echo)]), poll_interval_s=10.0
    ):
        await wait_for(
            lambda: pool.fetchval(
                "SELECT count(*) = 1 FROM pg_stat_activity WHERE query LIKE 'LISTEN%' AND datname = current_database()"
            )
        )
        # Listening is all the test needs: a NOTIFY that lands during the worker's first (empty)
        # claim wakes it again at once, and one before it is seen by that claim.
        latencies = []
        for _ in range(5):
            job_id = await pool.fetchval(
                "INSERT INTO job_queue (workspace_id, job_type, payload)"
                " VALUES ($1, 'noop', '{}') RETURNING id",
                workspace,
            )
            await wait_for(
                lambda: pool.fetchval(
                    "SELECT status = 'completed' FROM job_queue WHERE id = $1", job_id
                ),
                5,
            )
            latencies.append(
                await pool.fetchval(
                    "SELECT extract(epoch FROM started_at - created_at) FROM job_queue WHERE id = $1",
                    job_id,
                )
            )
        # A generous bound for a loaded CI machine; with 10 s polling only NOTIFY can do this.
        assert max(latencies) < 1.0, latencies


async def test_a_killed_listen_connection_is_replaced(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    async with running_worker(
        pool, db_url, Registry([job_type("noop", _echo)]), poll_interval_s=30.0
    ):
        listening = "SELECT pid FROM pg_stat_activity WHERE query LIKE 'LISTEN%' AND datname = current_database()"
        await wait_for(lambda: pool.fetchval(f"SELECT count(*) = 1 FROM ({listening}) l"))
        old_pid = await pool.fetchval(listening)
        await pool.execute("SELECT pg_terminate_backend($1)", old_pid)
        await wait_for(
            lambda: pool.fetchval(
                f"SELECT count(*) = 1 FROM ({listening}) l WHERE pid <> $1", old_pid
            )
        )
        job_id = await pool.fetchval(
            "INSERT INTO job_queue (workspace_id, job_type, payload)"
            " VALUES ($1, 'noop', '{}') RETURNING id",
            workspace,
        )
        await wait_for(
            lambda: pool.fetchval(
                "SELECT status = 'completed' FROM job_queue WHERE id = $1", job_id
            ),
            5,
        )


async def test_kill_9_mid_run_loses_nothing(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    # Every 100th job takes 500 ms, so that the victim can be killed while it surely holds one:
    # with only 20 ms jobs, all of its jobs could be finished, their completion in flight (and
    # committed by the server after the kill), leaving nothing to rescue.
    await pool.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload)"
        " SELECT $1, 'noop', CASE WHEN i % 100 = 0 THEN '{\"sleep_ms\": 500}'"
        " ELSE '{\"sleep_ms\": 20}' END::jsonb FROM generate_series(1, 3000) AS i",
        workspace,
    )
    args = ("run", "--max-concurrent", "20", "--lease", "3s", "--poll-interval", "200ms")
    debug = {"SIDELINJA_LOG_LEVEL": "debug"}  # a line per completed job (info: a summary)
    victim = spawn(*args, url=db_url, env=debug)
    await wait_for(
        lambda: pool.fetchval("SELECT count(*) >= 300 FROM job_queue WHERE status = 'completed'")
    )
    victim_id = await pool.fetchval("SELECT id FROM job_workers")
    survivors = [spawn(*args, url=db_url, env=debug) for _ in range(2)]
    await wait_for(lambda: pool.fetchval("SELECT count(*) = 3 FROM job_workers"))
    await wait_for(
        lambda: pool.fetchval(
            "SELECT count(*) > 0 FROM job_queue WHERE status = 'running' AND worker_id = $1"
            " AND payload->>'sleep_ms' = '500' AND started_at > now() - interval '250 ms'",
            victim_id,
        )
    )
    victim.send_signal(signal.SIGKILL)
    victim_err = victim.communicate()[1]
    await wait_for(
        lambda: pool.fetchval("SELECT count(*) = 3000 FROM job_queue WHERE status = 'completed'"),
        120,
    )
    for p in survivors:
        p.send_signal(signal.SIGTERM)
    outputs = [await asyncio.to_thread(p.communicate, timeout=60) for p in survivors]
    assert [p.returncode for p in survivors] == [0, 0], [e[-2000:] for _, e in outputs]
    assert await statuses(pool) == {"completed": 3000}
    rescued = {
        str(r["id"])
        for r in await pool.fetch(
            'SELECT id FROM job_queue WHERE errors @> \'[{"class": "rescued"}]\''
        )
    }
    assert rescued, "the victim held running jobs when killed; they must show as rescued"
    # Every job ran to completion once on a survivor, except those the victim finished and
    # wrote; a rescued job ran on a survivor exactly once, after its rescue.
    survivor_runs = Counter(m for _, err in outputs for m in DONE.findall(err))
    assert max(survivor_runs.values()) == 1
    assert all(survivor_runs[i] == 1 for i in rescued)
    victim_done = set(DONE.findall(victim_err))
    assert not (victim_done & set(survivor_runs)) - rescued


async def test_a_live_worker_keeps_its_jobs_past_the_lease(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """A 3 s job under a 1 s lease, with a second worker rescuing every 50 ms: never taken."""
    await pool.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload)"
        " VALUES ($1, 'noop', '{\"sleep_ms\": 3000}')",
        workspace,
    )
    settings: dict[str, Any] = {"lease_s": 1.0, "poll_interval_s": 0.05}
    runner = Worker(
        pool, db_url, Registry([job_type("noop", _sleepy)]), WorkerSettings(burst=True, **settings)
    )
    await _run_beside_a_rescuer(runner, pool, db_url, settings)
    row = await pool.fetchrow("SELECT status::text, attempts, errors FROM job_queue")
    assert tuple(row) == ("completed", 1, [])


async def test_handlers_holding_every_shared_connection_do_not_cost_the_lease(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """Handlers that hold every connection of the worker's shared pool for 3 s, under a 1 s
    lease, with a second worker rescuing every 50 ms: the heartbeat still renews the lease, so
    no job is taken from the worker that runs it."""
    await insert_jobs(pool, workspace, 3, job_type_name="hog")

    async def hog(ctx: JobContext, payload: Any) -> None:
        await ctx.services.pool.execute("SELECT pg_sleep(3)")

    settings: dict[str, Any] = {"lease_s": 1.0, "poll_interval_s": 0.05}
    shared = await create_pool(db_url, max_size=3)
    try:
        runner = Worker(
            shared, db_url, Registry([job_type("hog", hog)]), WorkerSettings(burst=True, **settings)
        )
        await _run_beside_a_rescuer(runner, pool, db_url, settings)
    finally:
        await shared.close()
    rows = await pool.fetch("SELECT status::text, attempts, errors FROM job_queue")
    assert [tuple(r) for r in rows] == [("completed", 1, [])] * 3


async def _run_beside_a_rescuer(
    runner: Worker, pool: asyncpg.Pool, db_url: str, settings: dict[str, Any]
) -> None:
    """Runs `runner` to its end while a second worker with `settings` rescues beside it."""
    rescuer = Worker(pool, db_url, Registry([job_type("other", _echo)]), WorkerSettings(**settings))
    rescuing = asyncio.create_task(rescuer.run())
    try:
        await asyncio.wait_for(runner.run(), 30)
    finally:
        rescuer.request_stop()
        await rescuing


async def test_jobs_holding_threads_do_not_keep_another_job_s_thread_work_waiting(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """As many jobs as asyncio's default pool has threads each block one: another job's thread
    work (a service answer parsed, say) still runs at once."""
    blockers = min(32, (os.cpu_count() or 1) + 4)
    loop = asyncio.get_running_loop()
    gate = threading.Event()
    in_threads: list[None] = []
    all_in = asyncio.Event()
    quick_done = asyncio.Event()

    def one_more_in() -> None:
        in_threads.append(None)
        if len(in_threads) == blockers:
            all_in.set()

    def blocked() -> None:
        loop.call_soon_threadsafe(one_more_in)
        gate.wait(30)

    async def block(ctx: JobContext, payload: Any) -> None:
        await asyncio.to_thread(blocked)

    async def quick(ctx: JobContext, payload: Any) -> None:
        await asyncio.to_thread(int, "1")
        quick_done.set()

    await insert_jobs(pool, workspace, blockers, job_type_name="block")
    registry = Registry([job_type("block", block), job_type("quick", quick)])
    async with running_worker(
        pool, db_url, registry, max_concurrent=blockers + 1, poll_interval_s=0.05
    ):
        try:
            await asyncio.wait_for(all_in.wait(), 10)
            await insert_jobs(pool, workspace, 1, job_type_name="quick")
            await asyncio.wait_for(quick_done.wait(), 5)
        finally:
            gate.set()
    assert await statuses(pool) == {"completed": blockers + 1}


# In a fresh interpreter (httpx imports its transport on the first client): the longest step
# of the event loop while the handlers' HTTP client is built, by `prepare_http` or on the loop.
_HTTP_CLIENT_STEP = """
import asyncio, sys, time
from sidelinja_worker.queue.context import Services

async def main():
    services = Services(None, None, None, None)
    steps, last = [], time.perf_counter()
    async def tick():
        nonlocal last
        while True:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            steps.append(now - last)
            last = now
    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0.02)
    steps.clear()
    if sys.argv[1] == "thread":
        await services.prepare_http()
    else:
        services.http
    await asyncio.sleep(0.01)
    ticker.cancel()
    assert services.http is not None
    await services.aclose()
    print(max(steps))

asyncio.run(main())
"""


def _http_client_step(how: str) -> float:
    done = subprocess.run(
        [sys.executable, "-c", _HTTP_CLIENT_STEP, how], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return float(done.stdout)


async def test_the_handlers_http_client_is_built_off_the_event_loop(
    pool: asyncpg.Pool, db_url: str
) -> None:
    """httpx's first client imports its transport and loads the CA bundle: 40-70 ms here. A
    worker builds it in a thread as it starts, unasked, so no job's loop waits for it."""
    async with running_worker(pool, db_url) as worker:
        await wait_for(
            lambda: worker._services is not None and worker._services._http is not None,
            10,
            "the HTTP client prepared without a job asking",
        )
    off_loop = await asyncio.to_thread(_http_client_step, "thread")
    on_loop = await asyncio.to_thread(_http_client_step, "loop")
    assert off_loop < 0.03, (off_loop, on_loop)


async def test_sigterm_waits_for_grace_then_gives_jobs_back(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    await insert_jobs(pool, workspace, 2, '{"sleep_ms": 60000}')
    await insert_jobs(pool, workspace, 1, '{"sleep_ms": 300}')
    port = free_port()
    proc = spawn(
        "run", "--grace", "1s", "--max-concurrent", "5", "--metrics-port", str(port), url=db_url
    )
    # Started by the worker, not only claimed: a claim is `running` in the table a moment before
    # its answer reaches the worker, and a SIGTERM in that moment gives the jobs back unstarted.
    await wait_for(lambda: _jobs_started(port, 3))
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = await asyncio.to_thread(proc.communicate, timeout=30)
    assert proc.returncode == 0, err
    assert time.monotonic() - started < 5  # the 1 s grace plus writing and exiting
    rows = await pool.fetch(
        "SELECT status::text, attempts, payload->>'sleep_ms' AS ms FROM job_queue"
    )
    assert sorted(tuple(r) for r in rows) == [
        ("completed", 1, "300"),
        ("pending", 0, "60000"),
        ("pending", 0, "60000"),
    ]
    assert await pool.fetchval("SELECT count(*) FROM job_workers") == 0


JOBS_THROUGH_KILLS = 6000


async def test_workers_survive_their_connections_being_killed(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    # Enough work that the workers are still at it in the third round: 2,000 jobs once drained
    # between two rounds on a fast hour of the CI machine, and the round waited in vain.
    await insert_jobs(pool, workspace, JOBS_THROUGH_KILLS, '{"sleep_ms": 2}')
    procs = [
        spawn("run", "--burst", "--max-concurrent", "10", "--poll-interval", "100ms", url=db_url)
        for _ in range(2)
    ]
    for _ in range(3):  # three rounds of "the database dropped every worker connection"
        await wait_for(
            lambda: pool.fetchval("SELECT count(*) > 0 FROM job_queue WHERE status = 'running'")
        )
        await kill_worker_connections(pool)
    outputs = [await asyncio.to_thread(p.communicate, timeout=120) for p in procs]
    # On failure, each worker's lines but its info logs (a summary of completions every 10 s).
    assert [p.returncode for p in procs] == [0, 0], "\n".join(
        line for _, e in outputs for line in e.splitlines() if '"level":"info"' not in line
    )
    # Nothing waits for a lease: a claim whose answer was lost with the connection is given
    # back by the worker that holds it.
    assert await statuses(pool) == {"completed": JOBS_THROUGH_KILLS}
    assert (
        await pool.fetchval("SELECT count(*) FROM job_queue WHERE result IS NULL") == 0
    )  # never done without result


async def _echo(ctx: JobContext, payload: Any) -> Any:
    return payload.model_dump()


async def _sleepy(ctx: JobContext, payload: Any) -> Any:
    await asyncio.sleep(payload.model_dump().get("sleep_ms", 0) / 1000)
    return "slept"


async def test_a_connection_lost_while_a_pool_prepares_is_a_user_error(db_url: str) -> None:
    """A connection terminated while a new pool's `prepare` ran (the claim pool's, at a
    worker's start) raised asyncpg's own InternalClientError ("cannot switch to state 12;
    another operation (2) is in progress"), which create_pool let through: the starting worker
    exited 2 instead of going on with its shared pool (seen in the killed-connections test
    above, under load). Here the prepare ends as that connection's did."""

    async def lost(conn: asyncpg.Connection) -> None:
        raise asyncpg.InternalClientError("cannot switch to state 12; another operation (2)")

    with pytest.raises(UserError, match="cannot switch to state 12"):
        await create_pool(db_url, min_size=1, max_size=1, prepare=lost)


async def test_a_handler_that_asks_the_process_to_exit_fails_its_job_not_the_worker(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """A handler (or a library it calls: a command-line tool's main, an argument parser) that
    raises SystemExit or KeyboardInterrupt went past the executor's handling of exceptions
    and out of the event loop: the whole worker stopped, its other jobs left to the lease
    rescue, and with SystemExit(0) it exited 0, which a process manager takes for a clean
    stop and does not restart. The attempt fails (transient) like any other handler fault."""

    async def exits(ctx: JobContext, payload: Any) -> None:
        if payload.kind == "exit":
            raise SystemExit(0)
        raise KeyboardInterrupt

    await pool.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload, max_attempts)"
        " SELECT $1, 'exits', jsonb_build_object('kind', k), 1"
        " FROM unnest(ARRAY['exit', 'interrupt', 'exit']) k",
        workspace,
    )
    await asyncio.wait_for(
        run_burst(pool, db_url, Registry([job_type("exits", exits)]), max_concurrent=2), 30
    )
    rows = await pool.fetch("SELECT status::text, error_msg FROM job_queue ORDER BY error_msg")
    assert [(r[0], r[1]) for r in rows] == [
        ("error", "KeyboardInterrupt: "),
        ("error", "SystemExit: 0"),
        ("error", "SystemExit: 0"),
    ]
