"""The worker's own connections: a pool for claims and outcome writes, one for its lease."""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from sidelinja_worker.queue import store
from sidelinja_worker.queue.db import create_pool

# The server ends a session of the worker's own pools that sits in a transaction this long
# without a statement. Between the statements of the worker's transactions (the claim lock and
# the claim under a cap; a completion and its follow-up jobs) a live worker waits only for its
# event loop, milliseconds; a stopped one (SIGSTOP, a paused VM, a machine gone from the
# network with its connection open) held the cluster-wide claim lock as long as it stayed
# stopped, and no capped claim of any worker went through. A session ended this way costs a
# live worker one retried statement; a stopped one's jobs come back by the lease rescue.
# Handlers' and the command line's sessions are not bounded: a handler may hold a transaction
# across a call to a service, `enqueue --file -` across what a person types. A stopped worker's
# sessions, these and its handlers', end when the rescue declares it dead (store.rescue).
IDLE_IN_TRANSACTION_S = 5
# Every session of `run`, whatever the role's or the database's defaults.
WORKER_SESSIONS = {
    # The engine bounds each of its statements itself (store.STATEMENT_TIMEOUT_S, doubled for
    # one that timed out, up to store.STATEMENT_TIMEOUT_MAX_S), handlers by their jobs'
    # timeouts. A server-side timeout shorter than an outcome that settles a big graph's
    # children failed that statement at every try: every outcome buffered behind it waited for
    # ever, and the heartbeat kept their jobs from the rescue.
    "statement_timeout": "0",
    # The connections idle by design (the LISTEN connection between notifications, the claim
    # pool's floor between jobs, kept open so that a pickup pays no connect): the server ended
    # them every few seconds, each end a warning, a reconnect and a slow pickup.
    "idle_session_timeout": "0",
    # The engine's statements are written for it (a claim's SKIP LOCKED, an outcome's recheck
    # of a row another transaction changed): under SERIALIZABLE, claims and outcome writes
    # failed and were retried by the dozen per thousand jobs. A handler wanting more sets it
    # for its own transaction.
    "default_transaction_isolation": "read committed",
}
# The longest the worker's own statements wait for a lock another session holds. Any role may
# lock its own rows (`SELECT ... FOR UPDATE` in a transaction left open): an outcome batch
# that waited on one job's row kept the outcomes of every workspace waiting with it. Past this,
# the batch is written row by row and the locked row waits alone (outcomes.py).
LOCK_WAIT_S = 2
OWN_SESSIONS = {
    **WORKER_SESSIONS,
    "idle_in_transaction_session_timeout": f"{IDLE_IN_TRANSACTION_S}s",
    "lock_timeout": f"{LOCK_WAIT_S}s",
}


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
        settings=OWN_SESSIONS,
        prepare=lambda conn: store.prepare_hot_path(conn, job_types),
    )


async def open_lease_pool(url: str) -> asyncpg.Pool:
    """The connection for the worker's own bookkeeping: registration, heartbeats, the rows read
    for cancels and reconciliation, giving jobs back. Handlers never take it: on the shared
    pool, handlers holding every connection (long writes of stats or knowledge) kept the
    heartbeat waiting past the lease, so other workers rescued jobs that were running
    healthily, again and again until they ended in `error`. Its statements are short (each
    bounded by store.STATEMENT_TIMEOUT_S), so one connection serves them in turn."""
    return await create_pool(url, min_size=1, max_size=1, settings=OWN_SESSIONS)
