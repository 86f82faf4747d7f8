"""A worker that stops without dying: a process stopped by SIGSTOP, a paused VM, a machine gone
from the network with its connections left open. Its leases run out and its jobs run
elsewhere; it must hold nothing the rest of the fleet waits for, and what it does once it wakes
must not overwrite what ran meanwhile."""

from __future__ import annotations

import asyncio
import random
import signal
import time
from uuid import UUID, uuid4

import asyncpg
import pytest

from sidelinja_worker.queue import store
from sidelinja_worker.queue.jobs import ClaimedJob
from sidelinja_worker.queue.pools import open_claim_pool
from sidelinja_worker.queue.queries import QUERIES
from tests.helpers import insert_jobs, run_burst, running_worker, spawn, statuses, wait_for
from tests.tcp_proxy import proxy_for


async def test_a_claim_connection_stopped_inside_its_transaction_does_not_stop_the_fleet(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """A claim under a cap takes the cluster-wide claim lock, then claims, in one transaction
    of two statements. A worker stopped between the two (here: a connection of the worker's
    claim pool that takes the lock and is never heard from again) held the lock for as long as
    it stayed stopped, and no capped claim of any worker went through. The server ends such a
    session: another worker drains its capped jobs."""
    await store.set_type_limit(pool, "noop", 5)
    await insert_jobs(pool, workspace, 20, job_type_name="noop")
    frozen = await open_claim_pool(db_url, ["noop"])
    try:
        async with frozen.acquire() as conn:
            await conn.execute("BEGIN")
            await conn.execute(QUERIES["lock_limited_claims"])
            stopped_pid = conn.get_server_pid()
            started = time.monotonic()
            await asyncio.wait_for(run_burst(pool, db_url, max_concurrent=5), 30)
            waited_s = time.monotonic() - started
            assert await statuses(pool) == {"completed": 20}
            gone = "SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)"
            assert await pool.fetchval(gone, stopped_pid)
    finally:
        frozen.terminate()
    assert waited_s < 20, waited_s


# When the stopped worker is resumed, after the stop: at once when the other worker runs its
# jobs (its heartbeat, overdue, finds it declared dead and cancels its handlers), or once its
# 2 s handlers are due too (they finish and their outcomes are sent first).
@pytest.mark.parametrize("resumed_after_s", [0.0, 2.1], ids=["handlers running", "handlers due"])
async def test_a_worker_stopped_past_its_lease_overwrites_nothing_and_comes_back(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, resumed_after_s: float
) -> None:
    """SIGSTOP a worker while it runs jobs, past its lease; another worker rescues them and runs
    them. SIGCONT: what the stopped worker does then (its late outcomes, its cancelled
    handlers' give-backs) may not touch a job that runs elsewhere now: every job it held ends
    completed by the other worker, with one rescue in its history. Then it runs jobs again, as
    a new worker."""
    await pool.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload)"
        " SELECT $1, 'noop', '{\"sleep_ms\": 2000}' FROM generate_series(1, 30)",
        workspace,
    )
    args = ("run", "--max-concurrent", "10", "--lease", "1s", "--poll-interval", "100ms")
    victim = spawn(*args, url=db_url)
    await wait_for(
        lambda: pool.fetchval("SELECT count(*) >= 10 FROM job_queue WHERE status = 'running'")
    )
    victim_id = await pool.fetchval("SELECT id FROM job_workers")
    held = [
        r[0]
        for r in await pool.fetch(
            "SELECT id FROM job_queue WHERE status = 'running' AND worker_id = $1", victim_id
        )
    ]
    victim.send_signal(signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        other = spawn(
            "run", "--max-concurrent", "50", "--lease", "1s", "--poll-interval", "100ms", url=db_url
        )
        await wait_for(
            lambda: pool.fetchval(
                "SELECT count(*) = $2 FROM job_queue WHERE id = ANY($1) AND status = 'running'"
                " AND worker_id <> $3",
                held,
                len(held),
                victim_id,
            ),
            what="the other worker runs every job the stopped one held",
        )
        other_id = await pool.fetchval("SELECT worker_id FROM job_queue WHERE id = $1", held[0])
        # The other worker's runs of the same jobs, started a lease after the stop, go on.
        await asyncio.sleep(max(0.0, stopped_at + resumed_after_s - time.monotonic()))
    finally:
        victim.send_signal(signal.SIGCONT)
    await wait_for(
        lambda: pool.fetchval(
            "SELECT count(*) = 1 FROM job_workers WHERE pid = $1 AND id <> $2",
            victim.proc.pid,
            victim_id,
        ),
        what="the stopped worker registers again under a new id",
    )
    await wait_for(
        lambda: pool.fetchval("SELECT count(*) = 30 FROM job_queue WHERE status = 'completed'"),
        what="every job completed",
    )
    # Completed by the other worker's own run: its 2 s handler after its claim, never earlier.
    rows = await pool.fetch(
        "SELECT worker_id, attempts, errors, completed_at - started_at >= interval '2 s' AS ran"
        " FROM job_queue WHERE id = ANY($1)",
        held,
    )
    assert {r["worker_id"] for r in rows} == {other_id}
    assert all(
        r["ran"] and r["attempts"] == 2 and [e["class"] for e in r["errors"]] == ["rescued"]
        for r in rows
    ), [dict(r) for r in rows]
    assert "was declared dead" in victim.stderr_so_far()

    # Back as a new worker, it runs jobs again, and the other one is gone.
    other.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(other.proc.wait, 60) == 0
    reborn = await pool.fetchval("SELECT id FROM job_workers WHERE pid = $1", victim.proc.pid)
    await insert_jobs(pool, workspace, 20, job_type_name="noop")
    await wait_for(
        lambda: pool.fetchval(
            "SELECT count(*) = 20 FROM job_queue WHERE status = 'completed' AND worker_id = $1",
            reborn,
        ),
        what="the worker that came back completes the new jobs",
    )
    victim.send_signal(signal.SIGTERM)
    _, err = await asyncio.to_thread(victim.communicate, 60)
    assert victim.returncode == 0, err[-2000:]


CAP = 6


async def test_workers_stopped_and_resumed_at_random_lose_nothing_and_pass_no_cap(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """Three workers run 100 jobs of a capped type (0.3-1.5 s each) under a 1 s lease, while
    one or two of them at a time are stopped for 0.2-3 s and resumed, ten times. Nothing is
    lost or left running (every job ends completed, each by a run of its whole length), the cap
    is never passed in the rows, and every worker is alive and working at the end (each takes
    jobs of a new batch) and stops cleanly. Late outcomes themselves are the test above's: here
    a rescued job is rarely still running elsewhere when its first worker wakes."""
    rng = random.Random()
    seed = rng.randrange(2**32)
    rng.seed(seed)
    await store.set_type_limit(pool, "noop", CAP)
    await pool.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload, max_attempts)"
        " SELECT $1, 'noop', jsonb_build_object('sleep_ms', 300 + (random() * 1200)::int),"
        " 1000 FROM generate_series(1, 100)",
        workspace,
    )
    args = ("run", "--max-concurrent", "4", "--lease", "1s", "--poll-interval", "100ms")
    workers = [spawn(*args, url=db_url) for _ in range(3)]
    await wait_for(
        lambda: pool.fetchval(
            "SELECT count(DISTINCT worker_id) = 3 FROM job_queue WHERE status = 'running'"
        ),
        what="three workers running jobs",
    )
    most = 0
    done = asyncio.Event()

    async def watch() -> None:
        nonlocal most
        while not done.is_set():
            running = await pool.fetchval(
                "SELECT count(*) FROM job_queue WHERE status = 'running' AND job_type = 'noop'"
            )
            most = max(most, running)

    watcher = asyncio.create_task(watch())
    try:
        for _ in range(10):
            stopped = rng.sample(workers, rng.choice((1, 1, 2)))
            for w in stopped:
                w.send_signal(signal.SIGSTOP)
            try:
                await asyncio.sleep(rng.uniform(0.2, 3.0))
            finally:
                for w in stopped:
                    w.send_signal(signal.SIGCONT)
            await asyncio.sleep(rng.uniform(0.1, 0.5))
        await wait_for(
            lambda: pool.fetchval(
                "SELECT count(*) = 100 FROM job_queue WHERE status = 'completed'"
            ),
            120,
            f"every job completed (seed {seed})",
        )
    finally:
        done.set()
        await watcher
    assert most <= CAP, (most, seed)
    short = await pool.fetch(
        "SELECT id, attempts, completed_at - started_at AS took, payload FROM job_queue"
        " WHERE completed_at - started_at < make_interval(secs => (payload->>'sleep_ms')::int"
        " / 1000.0)"
    )
    assert not short, (seed, [dict(r) for r in short])
    # Alive and working: each holds a live lease, and each takes jobs of a new batch.
    await wait_for(
        lambda: pool.fetchval("SELECT count(*) = 3 FROM job_workers WHERE expires_at > now()"),
        what=f"three live workers (seed {seed})",
    )
    await store.set_type_limit(pool, "noop", None)
    batch = [
        r[0]
        for r in await pool.fetch(
            "INSERT INTO job_queue (workspace_id, job_type, payload)"
            " SELECT $1, 'noop', '{\"sleep_ms\": 200}' FROM generate_series(1, 60) RETURNING id",
            workspace,
        )
    ]
    await wait_for(
        lambda: pool.fetchval(
            "SELECT count(DISTINCT j.worker_id) = 3 FROM job_queue j JOIN job_workers w"
            " ON w.id = j.worker_id WHERE j.id = ANY($1) AND j.status = 'completed'",
            batch,
        ),
        what=f"every worker completes jobs of the new batch (seed {seed})",
    )
    for w in workers:
        w.send_signal(signal.SIGTERM)
    for w in workers:
        _, err = await asyncio.to_thread(w.communicate, 60)
        assert w.returncode == 0, (seed, err[-2000:])


async def test_a_worker_declared_dead_loses_its_sessions_and_the_locks_they_held(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """A worker stopped or cut off, not killed, keeps its sessions, and with them its open
    transactions' locks: here, the cluster-wide claim lock of a capped claim whose answer the
    server is still sending it (so no idle-in-transaction timeout reaches it), and a row lock
    its handler took on the job it runs. Before, every capped claim of the fleet waited on the
    first, and the second kept the job from the rescue, both for as long as the worker stayed
    stopped. The rescue that declares it dead now ends its sessions (job_workers.sessions)."""
    name = "sidelinja-worker frozen0test"
    dead_id = uuid4()
    await pool.execute(
        "INSERT INTO job_workers (id, hostname, pid, expires_at, sessions)"
        " VALUES ($1, 'elsewhere', 1, now() - interval '1 minute', $2)",
        dead_id,
        name,
    )
    held = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload, status, worker_id, started_at,"
        " attempts) VALUES ($1, 'noop', '{}', 'running', $2, now(), 1) RETURNING id",
        workspace,
        dead_id,
    )
    await store.set_type_limit(pool, "noop", 5)
    await insert_jobs(pool, workspace, 10, job_type_name="noop")

    proxy, via_proxy = await proxy_for(db_url)
    settings = {"application_name": name}
    claiming = await asyncpg.connect(via_proxy, server_settings=settings)
    handler = await asyncpg.connect(db_url, server_settings=settings)
    answer: asyncio.Task[list[asyncpg.Record]] | None = None
    try:
        # The handler's transaction, holding its job's row.
        await handler.execute("BEGIN")
        await handler.execute("SELECT FROM job_queue WHERE id = $1 FOR UPDATE", held)
        # The claim lock, then an answer of 64 MB that the worker stops reading half a second
        # in: the server blocks in its send once the sockets' buffers are full.
        await claiming.execute("BEGIN")
        await claiming.execute(QUERIES["lock_limited_claims"])
        pid = claiming.get_server_pid()
        answer = asyncio.create_task(
            claiming.fetch(
                "SELECT CASE WHEN g = 1 THEN pg_sleep(0.5)::text END, repeat('x', 1048576)"
                " FROM generate_series(1, 64) g"
            )
        )
        waits_on = "SELECT wait_event = $2 FROM pg_stat_activity WHERE pid = $1"
        await wait_for(lambda: pool.fetchval(waits_on, pid, "PgSleep"), what="the answer starts")
        proxy.black_hole()
        await wait_for(
            lambda: pool.fetchval(waits_on, pid, "ClientWrite"),
            what="the server blocks sending the answer",
        )

        async with running_worker(pool, db_url, max_concurrent=5, poll_interval_s=0.05):
            await wait_for(
                lambda: pool.fetchval(
                    "SELECT count(*) = 11 FROM job_queue WHERE status = 'completed'"
                ),
                timeout_s=20,
                what="the capped jobs and the rescued one completed",
            )
        ours = "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1"
        assert await pool.fetchval(ours, name) == 0
        errors = await pool.fetchval("SELECT errors FROM job_queue WHERE id = $1", held)
        assert [e["class"] for e in errors] == ["rescued"]
    finally:
        if answer is not None:
            answer.cancel()
        claiming.terminate()
        handler.terminate()
        await proxy.close()


async def test_jobs_claimed_but_not_started_when_declared_dead_leave_the_claims_going(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """A worker stopped right after a claim's answer arrived, before its slots took the jobs:
    when it wakes, its lease has lapsed, so its slots start none of them, and its claim loop,
    with every slot spoken for by the jobs held, waits for a slot to free. Declared dead, it
    drops the held jobs (they run elsewhere) and comes back as a new worker; the claim loop
    went on waiting for a slot that no job would ever free, and the worker claimed nothing
    again while it lived (seen once in ten runs of the stopped-worker test above). Here the
    state is set up by hand: held jobs, a lapsed lease, then the heartbeat's finding."""
    async with running_worker(
        pool, db_url, max_concurrent=2, lease_s=30, poll_interval_s=0.05
    ) as worker:
        await wait_for(lambda: pool.fetchval("SELECT count(*) = 1 FROM job_workers"))
        worker._lease_deadline = 0.0  # the lease lapsed while the process was stopped
        worker._ready.extend(
            ClaimedJob(uuid4(), workspace, "noop", {}, 0, 1, 3, None) for _ in range(2)
        )
        worker._slot_freed.set()
        worker.wake()
        await wait_for(
            lambda: not worker._slot_freed.is_set(), what="the claim loop waits for a slot"
        )
        await worker._declared_dead()
        await insert_jobs(pool, workspace, 3, job_type_name="noop")
        await wait_for(
            lambda: pool.fetchval("SELECT count(*) = 3 FROM job_queue WHERE status = 'completed'"),
            timeout_s=10,
            what="the worker that came back claims and runs new jobs",
        )


async def test_the_rescue_ends_no_session_but_a_worker_s(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """`job_workers.sessions` is a name any writer of that table may set: a dead worker's row
    naming the admin view's sessions (or the web app's) must not make the rescue end them."""
    bystander = await asyncpg.connect(
        db_url, server_settings={"application_name": "sidelinja-admin"}
    )
    try:
        await pool.execute(
            "INSERT INTO job_workers (id, hostname, pid, expires_at, sessions)"
            " VALUES ($1, 'elsewhere', 1, now() - interval '1 minute', 'sidelinja-admin')",
            uuid4(),
        )
        await store.rescue(pool, 60)
        assert await pool.fetchval("SELECT count(*) FROM job_workers") == 0
        assert await bystander.fetchval("SELECT 1") == 1
    finally:
        bystander.terminate()
