"""The database out of reach for longer than the lease (a failover, a restart, the network),
then back. Every lease ran out while no worker could renew its own: a worker back first must
not declare the others dead for it, or every job running anywhere is taken from the worker
that still runs it and run a second time."""

from __future__ import annotations

import asyncio
import contextlib
import random
from uuid import UUID

import asyncpg

from sidelinja_worker.queue.db import create_pool
from tests.helpers import running_worker, wait_for
from tests.tcp_proxy import proxy_for

SETTINGS = {"lease_s": 3.0, "poll_interval_s": 0.05, "max_concurrent": 1}


async def test_leases_that_ran_out_while_the_database_was_down_are_not_taken(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """Two workers through a proxy, a 3 s lease; one runs a 9 s job. The proxy goes down (every connection
    reset, new ones refused) until both leases have run out, then up. Before, the first
    worker's rescue to get through reaped the other (and was reaped in turn), and the running
    job was put back and run again; now neither declares the other dead for a lease after it
    could reach the database again, and each renews its own lease within that."""
    proxy, via_proxy = await proxy_for(db_url)
    job_id = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload)"
        " VALUES ($1, 'noop', '{\"sleep_ms\": 9000}') RETURNING id",
        workspace,
    )
    first, second = [await create_pool(via_proxy, max_size=2) for _ in range(2)]
    try:
        async with running_worker(first, via_proxy, **SETTINGS) as runner:
            await wait_for(
                lambda: pool.fetchval(
                    "SELECT worker_id = $2 FROM job_queue WHERE id = $1", job_id, runner.id
                )
            )
            async with running_worker(second, via_proxy, **SETTINGS):
                await wait_for(lambda: pool.fetchval("SELECT count(*) = 2 FROM job_workers"))
                assert proxy.down() > 0
                await wait_for(
                    lambda: pool.fetchval(
                        "SELECT count(*) = 2 FROM job_workers"
                        " WHERE expires_at < now() - interval '0.5 s'"
                    ),
                    what="both leases ran out",
                )
                proxy.up()
                await wait_for(
                    lambda: pool.fetchval(
                        "SELECT status = 'completed' FROM job_queue WHERE id = $1", job_id
                    ),
                    what="the job completed",
                )
            row = await pool.fetchrow(
                "SELECT attempts, errors, worker_id FROM job_queue WHERE id = $1", job_id
            )
            assert (row["attempts"], row["errors"], row["worker_id"]) == (1, [], runner.id), dict(
                row
            )
    finally:
        await first.close()
        await second.close()
        await proxy.close()


async def test_outages_at_random_run_no_job_twice(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """Three workers through a proxy run 150 jobs of 0.05-0.5 s under a 2 s lease while the
    proxy goes down six times, for 0.1-4 s each (longer than the lease or not), at random
    moments: claims, outcomes and heartbeats cut in flight. Every job ends completed, in one
    attempt, and none was rescued: no worker declared another dead for an outage."""
    rng = random.Random()
    seed = rng.randrange(2**32)
    rng.seed(seed)
    proxy, via_proxy = await proxy_for(db_url)
    await pool.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload)"
        " SELECT $1, 'noop', jsonb_build_object('sleep_ms', 50 + (random() * 450)::int)"
        " FROM generate_series(1, 150)",
        workspace,
    )
    settings = {"lease_s": 2.0, "poll_interval_s": 0.05, "max_concurrent": 4}
    pools = [await create_pool(via_proxy, max_size=2) for _ in range(3)]
    try:
        async with contextlib.AsyncExitStack() as stack:
            for shared in pools:
                await stack.enter_async_context(running_worker(shared, via_proxy, **settings))
            for _ in range(6):
                await asyncio.sleep(rng.uniform(0.2, 1.0))
                proxy.down()
                await asyncio.sleep(rng.uniform(0.1, 4.0))
                proxy.up()
            await wait_for(
                lambda: pool.fetchval(
                    "SELECT count(*) = 150 FROM job_queue WHERE status = 'completed'"
                ),
                60,
                f"every job completed (seed {seed})",
            )
        twice = await pool.fetch(
            "SELECT id, attempts, errors FROM job_queue WHERE attempts <> 1 OR errors <> '[]'"
        )
        assert not twice, (seed, [dict(r) for r in twice])
    finally:
        for shared in pools:
            await shared.close()
        await proxy.close()
