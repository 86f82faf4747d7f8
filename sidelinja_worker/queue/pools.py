"""The worker's own connections: a pool for claims and outcome writes, one for its lease."""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from sidelinja_worker.queue import store
from sidelinja_worker.queue.db import create_pool


async def open_claim_pool(url: str, job_types: Sequence[str]) -> asyncpg.Pool:
    """The pool for claims and outcome writes, with generic plans. Both connections open now,
    the claims and the completion prepared on each, and stay open (a pool's floor is never
    closed for idleness): the first job after start-up or a quiet spell pays no connect, parse
    or planning in its pickup."""
    return await create_pool(
        url,
        min_size=2,
        max_size=2,
        generic_plans=True,
        prepare=lambda conn: store.prepare_hot_path(conn, job_types),
    )


async def open_lease_pool(url: str) -> asyncpg.Pool:
    """The connection for the worker's own bookkeeping: registration, heartbeats, the rows read
    for cancels and reconciliation, giving jobs back. Handlers never take it: on the shared
    pool, handlers holding every connection (long writes of stats or knowledge) kept the
    heartbeat waiting past the lease, so other workers rescued jobs that were running
    healthily, again and again until they ended in `error`. Its statements are short (each
    bounded by store.STATEMENT_TIMEOUT_S), so one connection serves them in turn."""
    return await create_pool(url, min_size=1, max_size=1)
