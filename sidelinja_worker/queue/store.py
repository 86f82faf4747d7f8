"""One typed async function per named query in sql/queries.sql; the only module that runs SQL
at run time (migrate.py runs the schema files)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple
from uuid import UUID

import asyncpg
from asyncpg.exceptions._base import DataError as ArgumentError  # asyncpg's "cannot encode"

from sidelinja_worker.queue import clock
from sidelinja_worker.queue.db import DB_ERRORS, Conn
from sidelinja_worker.queue.errors import UserError
from sidelinja_worker.queue.jobs import ClaimedJob
from sidelinja_worker.queue.queries import QUERIES as Q

log = logging.getLogger("sidelinja_worker.rescue")

# Every statement here but the enqueue (which runs in the caller's transaction) gives up after
# this long: on a connection that died silently (a half-open TCP path: no reset, no answer)
# it would otherwise wait forever, and with it the claim loop, the heartbeat or the outcome
# writer. The pools' release is bounded too (db.RELEASE_TIMEOUT_S), so such a connection is
# terminated, not returned to the pool. The engine's statements take milliseconds.
STATEMENT_TIMEOUT_S = 10.0
# Outcomes and the rescue also settle their jobs' graph children, ~35 µs each, so their
# statements may outlast STATEMENT_TIMEOUT_S; one that timed out is tried again with twice the
# time (longer_timeout), up to this.
STATEMENT_TIMEOUT_MAX_S = 640.0


# Rows given back a statement by the rescue, release_held and abandon_worker (and the worker's
# release_lost): any writer may set rows running under a worker by the hundred thousand, and one
# statement for all of them outlasts STATEMENT_TIMEOUT_S.
GIVE_BACK_BATCH = 2000


def longer_timeout(timeout_s: float) -> float:
    """The time a statement that timed out after `timeout_s` gets at its next try."""
    return min(2 * timeout_s, STATEMENT_TIMEOUT_MAX_S)


@dataclass(frozen=True, slots=True)
class Failure:
    job_id: UUID
    kind: str  # "transient" | "permanent" | "timeout" | "invalid_payload" | ...
    message: str
    permanent: bool
    delay_s: float  # before the retry; ignored when the job ends in error


@dataclass(frozen=True, slots=True)
class Release:
    job_id: UUID
    run_at: datetime | None  # None: due at once
    reason: str | None = None  # a deferral's reason, recorded in `progress`


@dataclass(frozen=True, slots=True)
class EnqueueRows:
    """Column arrays for the `enqueue` statement, one entry per job."""

    ids: list[UUID]
    workspace_ids: list[UUID]
    job_types: list[str]
    payloads: list[Any]
    priorities: list[int]
    scheduled_for: list[datetime | None]
    delays_s: list[float | None]
    max_attempts: list[int]
    unique_keys: list[str | None]
    timeouts_s: list[int | None]
    traceparents: list[str | None]


def claim_statement(fair: bool, type_capped: bool) -> str:
    """The claim for the queue's settings: round-robin across workspaces or oldest first, with
    or without job type caps to count (workspace caps are counted by the fair claims)."""
    if fair:
        return "claim_fair_capped" if type_capped else "claim_fair"
    return "claim_capped" if type_capped else "claim"


async def claim(
    conn: Conn,
    worker_id: UUID,
    limit: int,
    job_types: Sequence[str] | None,
    now: datetime | None = None,
) -> list[ClaimedJob]:
    """The plain claim: oldest first, nothing counted. `now`: the claim's clock (None: the
    database's)."""
    rows = await conn.fetch(
        Q["claim"], worker_id, limit, job_types, now, timeout=STATEMENT_TIMEOUT_S
    )
    return [ClaimedJob(*r) for r in rows]


async def claim_with_limits(
    conn: asyncpg.Connection,
    worker_id: UUID,
    limit: int,
    job_types: Sequence[str],
    fair: bool,
    capped: bool,
    *,
    type_capped: bool | None = None,
    now: datetime | None = None,
) -> list[ClaimedJob]:
    """The claim `claim_statement` picks; with `capped` (some cap applies: running jobs are
    counted), under the cluster-wide claim lock. `type_capped` defaults to `capped`."""
    query = Q[claim_statement(fair, capped if type_capped is None else type_capped)]
    args = (worker_id, limit, list(job_types), now)
    if capped:
        async with conn.transaction():
            await conn.execute(Q["lock_limited_claims"], timeout=STATEMENT_TIMEOUT_S)
            rows = await conn.fetch(query, *args, timeout=STATEMENT_TIMEOUT_S)
    else:
        rows = await conn.fetch(query, *args, timeout=STATEMENT_TIMEOUT_S)
    return [ClaimedJob(*r) for r in rows]


NIL_WORKER = UUID(int=0)

# The same statement without its RETURNING clause, for the common batch with no follow-up
# jobs: nothing to send back and decode.
COMPLETE_QUIET = Q["complete"].rsplit("RETURNING", 1)[0]


async def prepare_hot_path(conn: asyncpg.Connection, job_types: Sequence[str]) -> None:
    """Runs the claims and the completion once, touching no row, so a new connection has them
    prepared (asyncpg's statement cache) and planned (generic plans) before its first real
    use. Left to that first use, it cost the job it carried ~5 ms of parse and planning: the
    slowest pickup of the benchmark's 200 when the claim pool's second connection first
    claimed. No worker has the nil id, so the claims take nothing; limit 0 besides."""
    for name in ("claim", "claim_fair"):
        await conn.fetch(Q[name], NIL_WORKER, 0, list(job_types), None, timeout=STATEMENT_TIMEOUT_S)
    await conn.execute(COMPLETE_QUIET, [], [], NIL_WORKER, timeout=STATEMENT_TIMEOUT_S)


async def complete(
    conn: Conn,
    worker_id: UUID,
    done: Sequence[tuple[UUID, Any]],
    timeout_s: float = STATEMENT_TIMEOUT_S,
) -> set[UUID]:
    """Marks the jobs completed; returns those that were still ours to complete."""
    rows = await conn.fetch(
        Q["complete"],
        [d[0] for d in done],
        [d[1] for d in done],
        worker_id,
        timeout=timeout_s,
    )
    return {r[0] for r in rows}


async def complete_quietly(
    conn: Conn,
    worker_id: UUID,
    done: Sequence[tuple[UUID, Any]],
    timeout_s: float = STATEMENT_TIMEOUT_S,
) -> None:
    """`complete`, not saying which jobs were still ours."""
    await conn.execute(
        COMPLETE_QUIET,
        [d[0] for d in done],
        [d[1] for d in done],
        worker_id,
        timeout=timeout_s,
    )


async def fail(
    conn: Conn,
    worker_id: UUID,
    failures: Sequence[Failure],
    timeout_s: float = STATEMENT_TIMEOUT_S,
) -> None:
    await conn.execute(
        Q["fail"],
        [f.job_id for f in failures],
        [f.kind for f in failures],
        [f.message for f in failures],
        [f.permanent for f in failures],
        [f.delay_s for f in failures],
        worker_id,
        timeout=timeout_s,
    )


async def release(
    conn: Conn,
    worker_id: UUID,
    releases: Sequence[Release],
    timeout_s: float = STATEMENT_TIMEOUT_S,
) -> None:
    await conn.execute(
        Q["release"],
        [r.job_id for r in releases],
        [r.run_at for r in releases],
        [r.reason for r in releases],
        worker_id,
        timeout=timeout_s,
    )


async def mark_cancelled(
    conn: Conn, worker_id: UUID, job_ids: Sequence[UUID], timeout_s: float = STATEMENT_TIMEOUT_S
) -> None:
    await conn.execute(Q["cancelled"], list(job_ids), worker_id, timeout=timeout_s)


async def enqueue(conn: Conn, rows: EnqueueRows) -> set[UUID]:
    """Inserts the rows; returns the ids actually inserted (a duplicate unique key is not)."""
    inserted = await conn.fetch(
        Q["enqueue"],
        rows.ids,
        rows.workspace_ids,
        rows.job_types,
        rows.payloads,
        rows.priorities,
        rows.scheduled_for,
        rows.delays_s,
        rows.max_attempts,
        rows.unique_keys,
        rows.timeouts_s,
        rows.traceparents,
    )
    return {r[0] for r in inserted}


async def copy_jobs(conn: Conn, rows: EnqueueRows, with_schedule: bool) -> None:
    """Binary COPY of jobs without unique keys or delays: the fastest bulk path. Defaults (and
    `scheduled_for` unless `with_schedule`) come from the table; the insert trigger still wakes
    the workers once for the whole COPY."""
    columns = ["id", "workspace_id", "job_type", "payload", "priority", "max_attempts", "timeout_s"]
    records: Any = zip(
        rows.ids,
        rows.workspace_ids,
        rows.job_types,
        rows.payloads,
        rows.priorities,
        rows.max_attempts,
        rows.timeouts_s,
        strict=True,
    )
    if with_schedule:
        columns.append("scheduled_for")
        records = ((*r, at) for r, at in zip(records, rows.scheduled_for, strict=True))
    if any(rows.traceparents):  # traced enqueues only: the column is left out otherwise
        columns.append("traceparent")
        records = ((*r, tp) for r, tp in zip(records, rows.traceparents, strict=True))
    try:
        await conn.copy_records_to_table("job_queue", records=records, columns=columns)
    except (TypeError, ValueError, OverflowError) as exc:
        # COPY encodes each value in Python and says so as a plain TypeError, ValueError or
        # OverflowError, where the INSERT path gets PostgreSQL's or asyncpg's DataError: taken
        # for a fault of the writer's, one such value among a job's 64 follow-ups killed the
        # outcome writer, and the worker with every other job's outcome it held.
        raise ArgumentError(f"a value COPY cannot send: {exc}") from None


async def add_dependencies(conn: Conn, edges: Sequence[tuple[UUID, UUID, bool]]) -> None:
    if edges:
        parents, children, anyway = zip(*edges, strict=True)
        await conn.execute(Q["add_dependencies"], list(parents), list(children), list(anyway))


async def job_payload(
    conn: Conn, job_id: UUID, max_bytes: int, max_containers: int
) -> tuple[int, int, Any] | None:
    """(size as JSON text, arrays and objects at most, payload or None when over `max_bytes` or
    `max_containers`) of a payload the claim left behind; None when the job is gone."""
    row = await conn.fetchrow(
        Q["job_payload"], job_id, max_bytes, max_containers, timeout=STATEMENT_TIMEOUT_S
    )
    return None if row is None else (row["size"], row["containers"], row["payload"])


async def parent_results(
    conn: Conn, job_id: UUID, max_bytes: int, max_parents: int
) -> list[asyncpg.Record]:
    """The job's first `max_parents` parents (id, job_type, status, result, total, parents);
    results only within `max_bytes` of JSON together (see the query)."""
    return await conn.fetch(
        Q["parent_results"], job_id, max_bytes, max_parents, timeout=STATEMENT_TIMEOUT_S
    )


# The most parents, and children, of one job read at once (`more` counts the rest).
MAX_RELATIVES = 1000


async def job_relatives(
    conn: Conn, job_id: UUID, limit: int = MAX_RELATIVES
) -> list[asyncpg.Record]:
    """The job's parents and children, at most `limit` of each, unfinished ones first."""
    return await conn.fetch(Q["job_relatives"], job_id, limit, timeout=STATEMENT_TIMEOUT_S)


async def has_child(conn: Conn, job_id: UUID, job_type: str) -> bool:
    return bool(await conn.fetchval(Q["has_child"], job_id, job_type, timeout=STATEMENT_TIMEOUT_S))


async def find_by_unique_keys(
    conn: Conn, keys: Sequence[tuple[UUID, str]]
) -> dict[tuple[UUID, str], UUID]:
    """(workspace, unique key) -> the job holding it, for the pairs that are held."""
    rows = await conn.fetch(Q["find_by_unique_keys"], [k[0] for k in keys], [k[1] for k in keys])
    return {(r[0], r[1]): r[2] for r in rows}


async def register_worker(
    conn: Conn,
    worker_id: UUID,
    hostname: str,
    pid: int,
    job_types: Sequence[str] | None,
    lease_s: float,
    version: str | None = None,
    concurrency: int | None = None,
    sessions: str | None = None,
) -> None:
    """`sessions`: the application_name of the worker's sessions (db.session_name), which the
    rescue that declares it dead ends (None: none). Reads the database's clock (clock.py)."""
    sent_s = time.time()
    db_now = await conn.fetchval(
        Q["register_worker"],
        worker_id,
        hostname,
        pid,
        list(job_types) if job_types else None,
        lease_s,
        version,
        concurrency,
        sessions,
        timeout=STATEMENT_TIMEOUT_S,
    )
    clock.observe(db_now, sent_s, time.time())


async def heartbeat(conn: Conn, worker_id: UUID, lease_s: float) -> bool | None:
    """Renews the lease; None if this worker was declared dead meanwhile, else whether an
    operator asked it to drain. Reads the database's clock (clock.py)."""
    sent_s = time.time()
    row = await conn.fetchrow(Q["heartbeat"], worker_id, lease_s, timeout=STATEMENT_TIMEOUT_S)
    if row is None:
        return None
    clock.observe(row[1], sent_s, time.time())
    return bool(row[0])


async def cancel_requests(conn: Conn, worker_id: UUID, job_ids: Collection[UUID]) -> set[UUID]:
    """Those of `job_ids`, running under this worker, whose row asks for their cancellation."""
    rows = await conn.fetch(
        Q["cancel_requests"], worker_id, list(job_ids), timeout=STATEMENT_TIMEOUT_S
    )
    return {r[0] for r in rows}


async def release_lost(
    conn: Conn, worker_id: UUID, known: Collection[UUID], limit: int
) -> list[UUID]:
    """Gives back up to `limit` rows running under this worker that are not in `known`."""
    rows = await conn.fetch(
        Q["release_lost"], worker_id, list(known), limit, timeout=STATEMENT_TIMEOUT_S
    )
    return [r[0] for r in rows]


async def cancel_requested(conn: Conn, job_id: UUID, worker_id: UUID) -> bool:
    return bool(
        await conn.fetchval(Q["cancel_requested"], job_id, worker_id, timeout=STATEMENT_TIMEOUT_S)
    )


async def release_held(conn: Conn, worker_id: UUID, limit: int = GIVE_BACK_BATCH) -> list[UUID]:
    """Gives back every row running under this worker, its attempt returned: at exit, once
    every outcome is written, such a row was claimed but never reached the worker."""
    return await _in_batches(
        lambda: conn.fetch(Q["release_lost"], worker_id, [], limit, timeout=STATEMENT_TIMEOUT_S),
        limit,
    )


async def abandon_worker(
    conn: Conn, worker_id: UUID, reason: str, limit: int = GIVE_BACK_BATCH
) -> list[UUID]:
    """Hands every row running under this worker back to the queue, each counted as an attempt;
    the caller unregisters the worker once this returns."""
    return await _in_batches(
        lambda: conn.fetch(
            Q["abandon_worker"], worker_id, reason, limit, timeout=STATEMENT_TIMEOUT_S
        ),
        limit,
    )


async def unregister_worker(conn: Conn, worker_id: UUID) -> None:
    await conn.execute(Q["unregister_worker"], worker_id, timeout=STATEMENT_TIMEOUT_S)


async def rescue(
    conn: Conn,
    orphan_after_s: float,
    timeout_s: float = STATEMENT_TIMEOUT_S,
    *,
    dead: set[UUID] | None = None,
    limit: int = GIVE_BACK_BATCH,
) -> list[UUID]:
    """Deletes the rows of workers whose lease expired, ends their database sessions
    (`end_sessions`), and puts back their running jobs and the orphans', `limit` a statement,
    each statement bounded by `timeout_s`. `dead` carries the reaped workers whose jobs are
    not all back yet from a rescue that failed halfway to the next: their rows are gone, and
    only it knows them until their jobs count as orphans."""
    dead = set() if dead is None else dead
    reaped = await conn.fetch(Q["reap_workers"], timeout=timeout_s)
    dead.update(r["id"] for r in reaped)
    names = [r["sessions"] for r in reaped if r["sessions"]]
    if names:
        await _end_sessions(conn, names, reaped[0]["reaped_at"], timeout_s)
    workers = list(dead)
    rescued = await _in_batches(
        lambda: conn.fetch(Q["rescue"], orphan_after_s, workers, limit, timeout=timeout_s), limit
    )
    dead.clear()
    return rescued


async def _end_sessions(conn: Conn, names: list[str], before: datetime, timeout_s: float) -> None:
    """The reaped workers' sessions, ended and logged. The jobs' rescue goes on whatever
    happens here: a refusal is logged, a lost connection raises as any statement's does."""
    try:
        ended = await conn.fetchval(Q["end_sessions"], names, before, timeout=timeout_s)
    except asyncpg.PostgresError as exc:
        if isinstance(exc, DB_ERRORS):
            raise
        log.warning("could not end the sessions of dead workers: %s", exc)
        return
    if ended:
        log.warning("ended %d database sessions of dead workers (%s)", ended, ", ".join(names))


async def _in_batches(
    fetch: Callable[[], Awaitable[list[asyncpg.Record]]], limit: int
) -> list[UUID]:
    """Runs `fetch`, a statement that gives back up to `limit` rows and returns their ids, until
    a run returns fewer: each statement (on a pool, each transaction) stays short however many
    rows any writer set running, and the first rows are back at once."""
    ids: list[UUID] = []
    while True:
        rows = await fetch()
        ids.extend(r[0] for r in rows)
        if len(rows) < limit:
            return ids
        await asyncio.sleep(0)  # let the loop's other tasks through between batches


# Where a prune's graph jobs resume: the (completed_at, id) of the last one a batch took.
PruneCursor = tuple[datetime, UUID]


class PruneBatch(NamedTuple):
    deleted: int
    last: PruneCursor | None  # the last graph job the batch took; None: none was left
    kept: list[UUID]  # the jobs of graphs the batch found kept whole


class PruneBlocked(UserError):
    """Another table references jobs through a foreign key that forbids their deletion, and
    this role may not read it, so the prune cannot tell which jobs to leave."""


async def prune_guard(conn: Conn) -> str:
    """The prune's condition that a job is referenced by no row of another table through a
    foreign key whose ON DELETE forbids deleting it (see `prune_guard` in queries.sql); empty
    when no such key exists. Read anew by each prune, so a key added meanwhile is seen."""
    row = await conn.fetchrow(Q["prune_guard"], timeout=STATEMENT_TIMEOUT_S)
    assert row is not None  # an aggregate always answers one row
    if not row["readable"]:
        raise PruneBlocked(
            f"finished jobs are referenced from {row['tables']} (a foreign key ON DELETE NO"
            " ACTION or RESTRICT), which this role may not read: grant it SELECT there, or"
            " declare the key ON DELETE SET NULL or CASCADE; nothing is pruned until then"
        )
    return row["clause"] or ""


async def prune(
    conn: Conn,
    completed_after_s: float,
    error_after_s: float,
    batch: int,
    after: PruneCursor | None = None,
    passed_over: Collection[UUID] = (),
    guard: str = "",
) -> PruneBatch:
    """Deletes one batch of finished jobs past retention, taking graph jobs after `after` and
    not in `passed_over` (graphs an earlier batch found kept); `guard` is `prune_guard`'s."""
    row = await conn.fetchrow(
        Q["prune"].replace("/* unreferenced */", guard),
        completed_after_s,
        error_after_s,
        batch,
        *(after or (None, None)),
        list(passed_over),
        timeout=STATEMENT_TIMEOUT_S,
    )
    assert row is not None  # the statement always answers one row
    last = None if row["last_id"] is None else (row["last_at"], row["last_id"])
    return PruneBatch(int(row["deleted"]), last, list(row["kept"]))


async def request_cancel(
    conn: Conn, job_id: UUID, timeout_s: float = STATEMENT_TIMEOUT_S
) -> tuple[str | None, str | None]:
    """(status after, status before); (None, None) when there is no such job. A cancel runs
    through the job's graph (its waiting descendants are cancelled with it), so a caller that
    cancels a large graph gives a longer timeout_s (the admin view does)."""
    row = await conn.fetchrow(Q["request_cancel"], job_id, timeout=timeout_s)
    return (row[0], row[1]) if row else (None, None)


async def get_job(conn: Conn, job_id: UUID) -> asyncpg.Record | None:
    return await conn.fetchrow(Q["get_job"], job_id, timeout=STATEMENT_TIMEOUT_S)


async def queue_state(conn: Conn, job_types: Sequence[str]) -> tuple[bool, int]:
    """(any due job of these types, how many of them run cluster-wide)."""
    row = await conn.fetchrow(Q["queue_state"], list(job_types), timeout=STATEMENT_TIMEOUT_S)
    assert row is not None
    return bool(row[0]), int(row[1])


async def ensure_workspace(conn: Conn, workspace_id: UUID, name: str) -> None:
    await conn.execute(Q["ensure_workspace"], workspace_id, name, timeout=STATEMENT_TIMEOUT_S)


async def workspace_exists(conn: Conn, workspace_id: UUID) -> bool:
    return bool(
        await conn.fetchval(Q["workspace_exists"], workspace_id, timeout=STATEMENT_TIMEOUT_S)
    )


@dataclass(frozen=True, slots=True)
class Limits:
    type_caps: dict[str, int]  # of the job types asked for
    workspace_capped: bool  # whether any workspace has a cap
    fair: bool


async def limits(conn: Conn, job_types: Sequence[str] | None = None) -> Limits:
    """The limits a worker of `job_types` (None: every type) claims under."""
    types = None if job_types is None else list(job_types)
    row = await conn.fetchrow(Q["limits"], types, timeout=STATEMENT_TIMEOUT_S)
    assert row is not None
    return Limits(dict(row[0]), bool(row[1]), bool(row[2]))


async def rate_acquire(conn: Conn, key: str, margin_s: float) -> tuple[bool, float]:
    row = await conn.fetchrow(Q["rate_acquire"], key, margin_s, timeout=STATEMENT_TIMEOUT_S)
    assert row is not None
    return bool(row[0]), float(row[1])


async def rate_pause(conn: Conn, key: str, seconds: float) -> None:
    await conn.execute(Q["rate_pause"], key, seconds, timeout=STATEMENT_TIMEOUT_S)


async def set_type_limit(conn: Conn, job_type: str, max_running: int | None) -> None:
    if max_running is None:
        await conn.execute(Q["clear_type_limit"], job_type, timeout=STATEMENT_TIMEOUT_S)
    else:
        await conn.execute(Q["set_type_limit"], job_type, max_running, timeout=STATEMENT_TIMEOUT_S)


async def set_workspace_limit(conn: Conn, workspace_id: UUID, max_running: int | None) -> None:
    if max_running is None:
        await conn.execute(Q["clear_workspace_limit"], workspace_id, timeout=STATEMENT_TIMEOUT_S)
    else:
        await conn.execute(
            Q["set_workspace_limit"], workspace_id, max_running, timeout=STATEMENT_TIMEOUT_S
        )


async def set_rate_limit(
    conn: Conn, key: str, max_requests: int | None, per_s: float | None
) -> None:
    if max_requests is None:
        await conn.execute(Q["clear_rate_limit"], key, timeout=STATEMENT_TIMEOUT_S)
    else:
        await conn.execute(
            Q["set_rate_limit"], key, max_requests, per_s, timeout=STATEMENT_TIMEOUT_S
        )


async def set_queue_setting(conn: Conn, name: str, value: Any) -> None:
    await conn.execute(Q["set_queue_setting"], name, value, timeout=STATEMENT_TIMEOUT_S)


async def list_limits(conn: Conn, timeout_s: float = STATEMENT_TIMEOUT_S) -> list[asyncpg.Record]:
    return await conn.fetch(Q["list_limits"], timeout=timeout_s)


async def report_progress(
    conn: Conn, job_id: UUID, worker_id: UUID, message: str, percent: float | None
) -> None:
    await conn.execute(
        Q["report_progress"], job_id, worker_id, message, percent, timeout=STATEMENT_TIMEOUT_S
    )


async def workspace_settings(conn: Conn, workspace_id: UUID, max_bytes: int) -> tuple[int, Any]:
    """(size as JSON text, settings or None when over `max_bytes`) of the workspace; (0, None)
    when it has no row."""
    row = await conn.fetchrow(
        Q["workspace_settings"], workspace_id, max_bytes, timeout=STATEMENT_TIMEOUT_S
    )
    return (0, None) if row is None else (row["size"], row["settings"])


async def why_facts(conn: Conn, job_id: UUID) -> asyncpg.Record | None:
    return await conn.fetchrow(Q["why_facts"], job_id, timeout=STATEMENT_TIMEOUT_S)


# How many job types each status counts by name; the rest are one row (job_type None).
COUNTS_MAX_TYPES = 100
OTHER_TYPES = "(other types)"  # the gauges' label for that row


async def counts(conn: Conn, timeout_s: float = STATEMENT_TIMEOUT_S) -> list[asyncpg.Record]:
    """Jobs by status and job type (see the query: at most COUNTS_MAX_TYPES named types per
    status, the rest under a job_type of None)."""
    return await conn.fetch(Q["counts"], COUNTS_MAX_TYPES, timeout=timeout_s)


async def oldest_due_s(conn: Conn, timeout_s: float = STATEMENT_TIMEOUT_S) -> float | None:
    """Seconds the oldest due job has waited; None with no due job (a gauge shows it as 0,
    a page as "nothing due": 0 s reads as a due job taken at once)."""
    found = await conn.fetchval(Q["oldest_due_s"], timeout=timeout_s)
    return None if found is None else float(found)


async def notify_queue_state(conn: Conn) -> asyncpg.Record:
    """The notification queue's usage (0-1) and whether status events and wake-ups pause."""
    row = await conn.fetchrow(Q["notify_queue_state"], timeout=STATEMENT_TIMEOUT_S)
    assert row is not None  # a function call returns one row
    return row


async def statistics_state(conn: Conn, min_rows: int) -> tuple[bool, bool]:
    """(stale, may_analyze) for job_queue's planner statistics: see queries.sql."""
    row = await conn.fetchrow(Q["statistics_state"], min_rows, timeout=STATEMENT_TIMEOUT_S)
    assert row is not None  # job_queue exists once migrated
    return row["stale"], row["may_analyze"]


async def analyze_queue(conn: asyncpg.Connection, timeout_s: float) -> bool:
    """ANALYZE job_queue, unless another session is doing it (False). ANALYZE reads a sample
    of the table (30,000 rows at the default statistics target), so it gets its own bound."""
    async with conn.transaction():
        if not await conn.fetchval(Q["try_statistics_lock"], timeout=STATEMENT_TIMEOUT_S):
            return False
        await conn.execute(Q["analyze_queue"], timeout=timeout_s)
    return True


async def pause_type(
    conn: Conn, job_type: str, by: str, reason: str, timeout_s: float = STATEMENT_TIMEOUT_S
) -> bool:
    """Pauses `job_type` cluster-wide; False if it was paused already."""
    return await conn.fetchval(Q["pause_type"], job_type, by, reason, timeout=timeout_s) is not None


async def resume_type(
    conn: asyncpg.Connection | asyncpg.Pool,
    job_type: str,
    by: str,
    reason: str,
    timeout_s: float = STATEMENT_TIMEOUT_S,
) -> bool:
    """Resumes `job_type`; False if it was not paused. One statement, so the settings that name
    who and why (read by the audit trigger) end with its transaction."""
    return (
        await conn.fetchval(Q["resume_type"], job_type, by, reason, timeout=timeout_s) is not None
    )


async def list_pauses(conn: Conn, timeout_s: float = STATEMENT_TIMEOUT_S) -> list[asyncpg.Record]:
    return await conn.fetch(Q["list_pauses"], timeout=timeout_s)


async def drain_worker(
    conn: Conn,
    worker_id: UUID,
    by: str,
    drain: bool = True,
    timeout_s: float = STATEMENT_TIMEOUT_S,
) -> bool:
    """Asks a worker to drain (or, with `drain` False, to claim again); False: no such worker."""
    return (
        await conn.fetchval(Q["drain_worker"], worker_id, by, drain, timeout=timeout_s) is not None
    )


async def list_workers(conn: Conn, timeout_s: float = STATEMENT_TIMEOUT_S) -> list[asyncpg.Record]:
    return await conn.fetch(Q["list_workers"], timeout=timeout_s)


async def add_minute_stats(conn: Conn, rows: Sequence[tuple[Any, ...]]) -> None:
    """Adds (minute epoch, workspace, job type, completed, failed, *buckets) rows to
    job_minute_stats."""
    await conn.execute(
        Q["add_minute_stats"],
        [datetime.fromtimestamp(r[0], UTC) for r in rows],
        [r[1] for r in rows],
        [r[2] for r in rows],
        [r[3] for r in rows],
        [r[4] for r in rows],
        [",".join(str(n) for n in r[5:]) for r in rows],
        timeout=STATEMENT_TIMEOUT_S,
    )


async def prune_minute_stats(conn: Conn, keep_s: float) -> None:
    await conn.execute(Q["prune_minute_stats"], keep_s, timeout=STATEMENT_TIMEOUT_S)


async def top_throughput(conn: Conn, minutes: int) -> list[asyncpg.Record]:
    return await conn.fetch(Q["top_throughput"], minutes, timeout=STATEMENT_TIMEOUT_S)


async def top_depth(conn: Conn) -> list[asyncpg.Record]:
    return await conn.fetch(Q["top_depth"], timeout=STATEMENT_TIMEOUT_S)
