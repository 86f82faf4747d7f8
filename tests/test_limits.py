"""Fair and bounded: fairness between workspaces, cluster-wide caps, shared rate limits."""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import orjson
import pytest

from sidelinja_worker.jobs import noop
from sidelinja_worker.queue import store
from sidelinja_worker.queue.context import JobContext
from sidelinja_worker.queue.queries import QUERIES
from sidelinja_worker.queue.registry import Registry
from tests.helpers import (
    cli,
    insert_jobs,
    job_type,
    make_workspace,
    run_burst,
    running_worker,
    spawn,
    statuses,
    wait_for_sql,
)
from tests.test_rls import WEB, RoleMaker, connected, make_role_fixture  # noqa: F401 (fixture)


async def test_a_single_job_of_another_workspace_is_not_starved(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    other = await make_workspace(pool, "B")
    await insert_jobs(pool, workspace, 10_000, job_type_name="embed")
    await insert_jobs(pool, other, 10, job_type_name="embed")
    started: list[UUID] = []

    async def record(ctx: JobContext, payload: Any) -> None:
        started.append(ctx.workspace_id)
        if len(started) >= 200:  # enough to judge; leave the rest queued
            raise asyncio.CancelledError

    async def stop_early() -> None:
        while len(started) < 200:
            await asyncio.sleep(0.01)

    from sidelinja_worker.queue.settings import WorkerSettings
    from sidelinja_worker.queue.worker import Worker

    worker = Worker(
        pool,
        db_url,
        Registry([job_type("embed", record)]),
        WorkerSettings(max_concurrent=4, poll_interval_s=0.05),
    )
    task = asyncio.create_task(worker.run())
    await asyncio.wait_for(stop_early(), 60)
    worker.request_stop()
    await task
    a_100th = [i for i, ws in enumerate(started) if ws == workspace][99]
    b_starts = [i for i, ws in enumerate(started) if ws == other]
    assert len(b_starts) == 10 and max(b_starts) < a_100th, (b_starts, a_100th)


async def test_priority_still_comes_before_fairness(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    other = await make_workspace(pool, "B")
    order: list[str] = []

    async def record(ctx: JobContext, payload: Any) -> None:
        order.append(payload.model_dump()["label"])

    for label, ws, prio in [("a-low", workspace, 0), ("b-low", other, 0), ("a-high", workspace, 9)]:
        await pool.execute(
            "INSERT INTO job_queue (workspace_id, job_type, payload, priority)"
            " VALUES ($1, 'rec', jsonb_build_object('label', $2::text), $3)",
            ws,
            label,
            prio,
        )
    await run_burst(pool, db_url, Registry([job_type("rec", record)]), max_concurrent=1)
    assert order[0] == "a-high" and sorted(order[1:]) == ["a-low", "b-low"]


async def test_type_cap_holds_across_processes_and_frees_after_kill_9(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    await store.set_type_limit(pool, "noop", 1)
    await insert_jobs(pool, workspace, 12, '{"sleep_ms": 60}')
    procs = [
        spawn("run", "--burst", "--max-concurrent", "5", "--poll-interval", "50ms", url=db_url)
        for _ in range(3)
    ]
    for p in procs:
        assert (await asyncio.to_thread(p.communicate, timeout=120))[0] is not None
    assert [p.returncode for p in procs] == [0, 0, 0]
    assert await statuses(pool) == {"completed": 12}
    # The jobs' own claim/finish times never overlap: one at a time, cluster-wide.
    spans = await pool.fetch("SELECT started_at, completed_at FROM job_queue ORDER BY started_at")
    for before, after in zip(spans, spans[1:]):
        assert before["completed_at"] <= after["started_at"], (before, after)
    assert await pool.fetchval("SELECT count(DISTINCT worker_id) FROM job_queue") >= 2

    # A worker killed while it holds the only slot: the slot frees with its lease.
    await pool.execute("DELETE FROM job_queue")
    stuck = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload, max_attempts)"
        " VALUES ($1, 'noop', '{\"sleep_ms\": 600000}', 1) RETURNING id",
        workspace,
    )
    victim = spawn("run", "--lease", "2s", "--poll-interval", "100ms", url=db_url)
    await wait_for_sql(pool, "SELECT status = 'running' FROM job_queue WHERE id = $1", stuck)
    nxt = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload)"
        " VALUES ($1, 'noop', '{}') RETURNING id",
        workspace,
    )
    victim.send_signal(signal.SIGKILL)
    victim.communicate()
    killed_at = time.monotonic()
    survivor = spawn("run", "--lease", "2s", "--poll-interval", "100ms", url=db_url)
    await wait_for_sql(pool, "SELECT status = 'completed' FROM job_queue WHERE id = $1", nxt)
    assert time.monotonic() - killed_at < 2 + 0.1 + 3  # lease + one poll + start-up slack
    why = cli("jobs", "why", str(stuck), url=db_url)
    assert "rescued from a dead worker" in why.stdout
    survivor.send_signal(signal.SIGTERM)
    await asyncio.to_thread(survivor.communicate, timeout=30)


async def test_workspace_cap(pool: asyncpg.Pool, db_url: str, workspace: UUID) -> None:
    await store.set_workspace_limit(pool, workspace, 2)
    now_running = peak = 0

    async def slow(ctx: JobContext, payload: Any) -> None:
        nonlocal now_running, peak
        now_running += 1
        peak = max(peak, now_running)
        await asyncio.sleep(0.03)
        now_running -= 1

    await insert_jobs(pool, workspace, 20, job_type_name="slow")
    await run_burst(pool, db_url, Registry([job_type("slow", slow)]), max_concurrent=8)
    assert peak == 2 and await statuses(pool) == {"completed": 20}


async def test_limits_change_at_run_time(pool: asyncpg.Pool, db_url: str, workspace: UUID) -> None:
    """A running worker picks up a new cap through NOTIFY, without a restart."""
    now_running = peak_after = 0
    capped = asyncio.Event()

    async def slow(ctx: JobContext, payload: Any) -> None:
        nonlocal now_running, peak_after
        now_running += 1
        if capped.is_set():
            peak_after = max(peak_after, now_running)
        await asyncio.sleep(0.02)
        now_running -= 1

    from sidelinja_worker.queue.settings import WorkerSettings
    from sidelinja_worker.queue.worker import Worker

    worker = Worker(
        pool,
        db_url,
        Registry([job_type("slow", slow)]),
        WorkerSettings(max_concurrent=6, poll_interval_s=0.05),
    )
    task = asyncio.create_task(worker.run())
    try:
        await store.set_type_limit(pool, "slow", 1)
        await wait_for_sql(pool, "SELECT true")
        while not worker._limits.capped(["slow"]):
            await asyncio.sleep(0.01)
        capped.set()
        await insert_jobs(pool, workspace, 15, job_type_name="slow")
        await wait_for_sql(pool, "SELECT count(*) = 15 FROM job_queue WHERE status = 'completed'")
    finally:
        worker.request_stop()
        await task
    assert peak_after == 1


def test_limits_command_shows_and_sets(db_url: str) -> None:
    out = cli("limits", "type", "whisper_transcribe", "1", url=db_url)
    assert out.returncode == 0 and "whisper_transcribe" in out.stdout
    out = cli("limits", "rate", "ai_gateway", "20/1m", url=db_url)
    assert "20 per 60 s" in out.stdout
    bad = cli("limits", "rate", "ai_gateway", "lots", url=db_url)
    assert bad.returncode != 0 and "20/1m" in bad.stderr
    # Numbers the table cannot hold, or windows no service means: refused, no traceback.
    for args, says in [
        (("type", "whisper_transcribe", "99999999999"), "at most 1,000,000"),
        (("rate", "ai_gateway", "99999999999/1m"), "at most 1,000,000 calls"),
        (("rate", "ai_gateway", "20/99999999999d"), "at most 366d"),
    ]:
        bad = cli("limits", *args, url=db_url)
        assert bad.returncode == 2 and says in bad.stderr, bad.stderr
        assert "Traceback" not in bad.stderr


def _fair_order(jobs: list[asyncpg.Record]) -> list[UUID]:
    """The documented fair order: priority first, then each workspace's turn within that
    priority level (its 1st, 2nd, ... oldest job), then age."""
    turns: dict[tuple[UUID, int], int] = {}
    keyed = []
    for j in sorted(jobs, key=lambda j: j["scheduled_for"]):
        turn = turns[(j["workspace_id"], j["priority"])] = (
            turns.get((j["workspace_id"], j["priority"]), 0) + 1
        )
        keyed.append(((-j["priority"], turn, j["scheduled_for"]), j["id"]))
    return [job_id for _, job_id in sorted(keyed)]


async def test_the_fair_claim_skips_workspaces_without_due_jobs(
    pool: asyncpg.Pool, workspace: UUID
) -> None:
    """The busy workspaces are found by a skip scan of the pending index, in workspace id
    order: one whose jobs are all scheduled later sits between two busy ones and is passed
    over, and the `workspaces` table, idle rows and all, is never read (probing each of its
    rows cost a claim 6.5 ms at 10,000 workspaces, bench/claim_latency.py)."""
    spaces = sorted([workspace] + [await make_workspace(pool, f"w{i}") for i in range(2)])
    for ws, later in zip(spaces, (False, True, False)):
        for _ in range(8):
            await pool.execute(
                "INSERT INTO job_queue (workspace_id, job_type, payload, scheduled_for)"
                " VALUES ($1, 'noop', '{}', now() + CASE WHEN $2 THEN interval '1 hour'"
                " ELSE interval '0' END)",
                ws,
                later,
            )
    worker_id = uuid4()
    await store.register_worker(pool, worker_id, "test", 1, ["noop"], 60)
    async with pool.acquire() as conn:
        got = await store.claim_with_limits(conn, worker_id, 10, ["noop"], True, False)
        plan = "\n".join(
            r[0]
            for r in await conn.fetch(
                "EXPLAIN " + QUERIES["claim_fair"], worker_id, 10, ["noop"], None
            )
        )
    taken = [j.workspace_id for j in got]
    assert taken.count(spaces[0]) == taken.count(spaces[2]) == 5 and spaces[1] not in taken
    assert "on workspaces" not in plan


async def test_a_worker_whose_lease_lapsed_claims_nothing(
    pool: asyncpg.Pool, workspace: UUID
) -> None:
    """Every path of the claim checks the worker's lease: the plain claim, the fair claim with
    one busy workspace (its own shortcut) and with two. Another worker may be rescuing this
    one's jobs, so it must start nothing new."""
    other = await make_workspace(pool, "w2")
    await insert_jobs(pool, workspace, 3)
    worker_id = uuid4()
    await store.register_worker(pool, worker_id, "test", 1, ["noop"], 60)
    await pool.execute(
        "UPDATE job_workers SET expires_at = now() - interval '1 second' WHERE id = $1", worker_id
    )
    for busy in (1, 2):
        if busy == 2:
            await insert_jobs(pool, other, 3)
        async with pool.acquire() as conn:
            assert await store.claim_with_limits(conn, worker_id, 10, ["noop"], True, False) == []
            assert await store.claim_with_limits(conn, worker_id, 10, ["noop"], False, False) == []
        assert await store.claim(pool, worker_id, 10, ["noop"]) == []
    await pool.execute(
        "UPDATE job_workers SET expires_at = now() + interval '1 minute' WHERE id = $1", worker_id
    )
    async with pool.acquire() as conn:  # renewed: the same claim takes them
        assert len(await store.claim_with_limits(conn, worker_id, 10, ["noop"], True, False)) == 6


async def _busy_workspaces(pool: asyncpg.Pool, n: int, job_type_name: str = "noop") -> list[UUID]:
    spaces = [await make_workspace(pool, f"w{i}") for i in range(n)]
    for ws in spaces:
        await insert_jobs(pool, ws, 2, job_type_name=job_type_name)
    return spaces


def _locked_rows(plan: Any) -> int:
    """Rows that the plan's LockRows nodes returned, over all their loops."""
    node = plan[0]["Plan"] if isinstance(plan, list) else plan
    own = node.get("Actual Rows", 0) * node.get("Actual Loops", 0)
    return (own if node["Node Type"] == "LockRows" else 0) + sum(
        _locked_rows(child) for child in node.get("Plans", ())
    )


async def test_a_claim_asks_only_as_many_workspaces_as_it_takes(
    pool: asyncpg.Pool, workspace: UUID
) -> None:
    """30 busy workspaces and a claim of 5: each share is one job, and only the 5 workspaces
    whose head jobs come first are asked for theirs, so 5 rows are locked, not 30 (at 1,000
    busy workspaces a claim of 50 took 18 ms locking 1,000 rows)."""
    spaces = await _busy_workspaces(pool, 30)
    worker_id = uuid4()
    await store.register_worker(pool, worker_id, "test", 1, ["noop"], 60)
    async with pool.acquire() as conn, conn.transaction():
        plan = orjson.loads(
            await conn.fetchval(
                "EXPLAIN (ANALYZE, FORMAT JSON) " + QUERIES["claim_fair"],
                worker_id,
                5,
                ["noop"],
                None,
            )
        )
        assert _locked_rows(plan) == 5
        claimed = await conn.fetch("SELECT workspace_id FROM job_queue WHERE status = 'running'")
    # the jobs were inserted workspace by workspace: the first five workspaces' heads are oldest
    assert sorted(r["workspace_id"] for r in claimed) == sorted(spaces[:5])


async def test_a_capped_type_at_the_head_of_many_workspaces_does_not_starve_another(
    pool: asyncpg.Pool, workspace: UUID
) -> None:
    """With a type cap, every busy workspace is still asked: the heads of the first workspaces
    are all of the capped type, and the other type's job behind them is claimed all the same."""
    await _busy_workspaces(pool, 12, job_type_name="capped")
    await insert_jobs(pool, workspace, 1, job_type_name="free")  # the newest job of all
    await store.set_type_limit(pool, "capped", 1)
    worker_id = uuid4()
    await store.register_worker(pool, worker_id, "test", 1, ["capped", "free"], 60)
    async with pool.acquire() as conn:
        got = await store.claim_with_limits(conn, worker_id, 5, ["capped", "free"], True, True)
    assert sorted(j.job_type for j in got) == ["capped", "free"]


async def test_every_fair_claim_is_a_prefix_of_the_fair_order(
    pool: asyncpg.Pool, workspace: UUID
) -> None:
    """Claims of several sizes over workspaces of very different sizes and mixed priorities:
    each claim takes jobs in exactly the fair order of what is left (it may come back short
    when a workspace's share is cut, never empty while jobs are due, never out of order)."""
    import random

    rnd = random.Random(7)
    spaces = [workspace] + [await make_workspace(pool, f"w{i}") for i in range(6)]
    sizes = [120, 40, 9, 3, 1, 1, 0]
    rows = [
        (ws, rnd.choice([0, 0, 0, 5, 9]), n) for ws, size in zip(spaces, sizes) for n in range(size)
    ]
    rnd.shuffle(rows)
    for i, (ws, prio, _) in enumerate(rows):  # distinct ages: the order has no ties
        await pool.execute(
            "INSERT INTO job_queue (workspace_id, job_type, payload, priority,"
            " scheduled_for) VALUES ($1, 'noop', '{}', $2,"
            " now() - make_interval(secs => $3))",
            ws,
            prio,
            1000 - i,
        )
    worker_id = uuid4()
    await store.register_worker(pool, worker_id, "test", 1, ["noop"], 60)
    claims = 0
    while left := await pool.fetch(
        "SELECT id, workspace_id, priority, scheduled_for FROM job_queue WHERE status = 'pending'"
    ):
        size = rnd.choice([1, 4, 10, 32])
        async with pool.acquire() as conn:
            got = await store.claim_with_limits(conn, worker_id, size, ["noop"], True, False)
        assert got, "a fair claim came back empty while jobs were due"
        assert set(j.id for j in got) == set(_fair_order(list(left))[: len(got)])
        claims += 1
    assert claims < len(rows)  # claims of more than one job did take more than one


async def test_jobs_why_names_each_reason(pool: asyncpg.Pool, db_url: str, workspace: UUID) -> None:
    """Every reason a job can wait, each set up by plain SQL and read back through the CLI."""

    async def why(job_id: UUID) -> str:
        out = cli("jobs", "why", str(job_id), url=db_url)
        assert out.returncode == 0, out.stderr
        return out.stdout

    async def job(sql_tail: str = "", *args: Any) -> UUID:
        return await pool.fetchval(
            "INSERT INTO job_queue (workspace_id, job_type, payload" + sql_tail + " RETURNING id",
            workspace,
            *args,
        )

    later = await job(", scheduled_for) VALUES ($1, 'noop', '{}', now() + interval '1 hour')")
    assert "not due until" in await why(later)
    lone = await job(") VALUES ($1, 'noop', '{}')")
    assert "no live worker handles noop jobs" in await why(lone)

    worker_id = uuid4()
    await store.register_worker(pool, worker_id, "test", 1, ["noop"], 600)
    holder = await job(
        ", status, worker_id, started_at) VALUES ($1, 'noop', '{}', 'running', $2, now())",
        worker_id,
    )
    await store.set_type_limit(pool, "noop", 1)
    capped = await why(lone)
    assert "no live worker" not in capped
    assert f"the cluster limit for noop (1 at once) is full, held by jobs {holder}" in capped

    await store.rate_pause(pool, "ai_gateway", 300)
    assert "service ai_gateway is rate-limited (paused) until" in await why(lone)

    deferred = await job(
        ", scheduled_for, progress) VALUES ($1, 'noop', '{}', now() + interval"
        " '60 seconds', jsonb_build_object('message', 'the call is live',"
        " 'deferred_until', now() + interval '60 seconds'))"
    )
    assert "deferred until" in await why(deferred) and "the call is live" in await why(deferred)
    # progress is jsonb any plain-SQL writer sets: a number, a string or a list is no deferral.
    for progress in ("5", '"deferred_until"', '["deferred_until"]'):
        odd = await job(
            ", scheduled_for, progress) VALUES ($1, 'noop', '{}', now() + interval '60 seconds',"
            f" '{progress}')"
        )
        assert "not due until" in await why(odd)

    for _ in range(2):
        await job(", priority) VALUES ($1, 'noop', '{}', 9)")
    assert "waiting behind 2 due jobs of higher priority" in await why(lone)


async def test_caps_of_other_types_by_the_thousand_never_stop_a_worker(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """Every worker read the caps of every job type ever written, as one JSON object: 30,000
    caps of 10 kB names (13 MB on disk, compressed) passed the 256 MB PostgreSQL builds one
    to, the read failed, and no worker started. A worker reads the caps of its own types."""
    await pool.execute(
        "INSERT INTO job_type_limits (job_type, max_running)"
        " SELECT i || repeat('x', 10000), 1 FROM generate_series(1, 30000) AS i"
    )
    await pool.execute("INSERT INTO job_type_limits (job_type, max_running) VALUES ('noop', 2)")
    await insert_jobs(pool, workspace, 20)
    await run_burst(pool, db_url)
    assert (await statuses(pool)) == {"completed": 20}
    limits = await store.limits(pool, ["noop", "whisper_transcribe"])
    assert (limits.type_caps, limits.workspace_capped) == ({"noop": 2}, False)


async def test_no_role_holds_up_capped_claims_with_a_lock_of_its_own(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, make_role: RoleMaker
) -> None:
    """The claim lock was an advisory lock, which PostgreSQL lets every role take: a login
    with no grant at all that held it stopped every claim that counts a cap, in every
    workspace (the claims timed out for as long as its session lasted). It is a row lock now,
    which only the tables' owner may take."""
    await pool.execute("INSERT INTO job_type_limits (job_type, max_running) VALUES ('noop', 2)")
    nobody = await make_role()
    async with connected(db_url, nobody) as conn:
        await conn.execute("SELECT pg_advisory_lock(7226133950251622721)")  # the old key
        await insert_jobs(pool, workspace, 5)
        await asyncio.wait_for(run_burst(pool, db_url, Registry([noop.JOB_TYPE])), 20)
        assert await statuses(pool) == {"completed": 5}
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("SELECT one FROM job_claim_lock FOR UPDATE")
        web = await make_role(WEB)
    async with connected(db_url, web) as conn:
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("SELECT one FROM job_claim_lock FOR UPDATE")


async def test_jobs_claimed_ahead_go_back_when_every_slot_runs_on(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """A worker used to short jobs claims ahead of its slots. A claim that brought two long
    jobs and forty short ones of other workspaces filled both slots with the long ones, and the
    forty waited, held, for as long as those ran (their timeouts: hours) while another worker
    had nothing to do. Held jobs go back to the queue once every slot has run on for
    HELD_WAIT_S, and the other worker runs them."""
    let_go = asyncio.Event()

    async def long(ctx: JobContext, payload: Any) -> None:
        await let_go.wait()

    registry = Registry([noop.JOB_TYPE, job_type("long", long), job_type("quick", _quick)])
    other = await make_workspace(pool)
    async with running_worker(pool, db_url, registry, max_concurrent=2) as first:
        await insert_jobs(pool, workspace, 200)  # short jobs: it learns to claim ahead
        await wait_for_sql(pool, "SELECT count(*) = 200 FROM job_queue WHERE status = 'completed'")
        await pool.execute(
            "INSERT INTO job_queue (workspace_id, job_type, payload, priority)"
            " SELECT $1::uuid, 'long', '{}'::jsonb, 5 FROM generate_series(1, 2)"
            " UNION ALL SELECT $2::uuid, 'quick', '{}'::jsonb, 1 FROM generate_series(1, 40)",
            workspace,
            other,
        )
        await wait_for_sql(
            pool,
            "SELECT count(*) = 42 FROM job_queue WHERE status = 'running' AND worker_id = $1",
            first.id,
        )
        try:
            async with running_worker(pool, db_url, Registry([job_type("quick", _quick)])):
                await wait_for_sql(
                    pool,
                    "SELECT count(*) = 40 FROM job_queue"
                    " WHERE job_type = 'quick' AND status = 'completed'",
                    timeout_s=15,
                )
        finally:
            let_go.set()
    assert await pool.fetchval("SELECT max(attempts) FROM job_queue WHERE job_type = 'quick'") == 1


async def _quick(ctx: JobContext, payload: Any) -> None:
    pass
