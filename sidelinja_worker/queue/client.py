"""Enqueue jobs on the caller's connection, so a job commits or rolls back with the caller's
transaction. One round trip for any number of jobs."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

import asyncpg

from sidelinja_worker.queue import store, tracing
from sidelinja_worker.queue.ids import uuid7s
from sidelinja_worker.queue.priorities import default_priority

SMALLINT_MAX = 32767


@dataclass(frozen=True)
class NewJob:
    """A job to enqueue. Give at most one of `scheduled_for` (an aware datetime) or `delay_s`.
    `priority=None` takes the job type's default. A `unique_key` held by another
    pending, retry or running job of the same workspace makes this job that one (dedupe)."""

    workspace_id: UUID | str
    job_type: str
    payload: Mapping[str, Any] = field(default_factory=dict)
    priority: int | None = None
    scheduled_for: datetime | None = None
    delay_s: float | None = None
    max_attempts: int = 3
    unique_key: str | None = None
    timeout_s: int | None = None
    # Graphs: the jobs this one waits for (their ids), and whether it runs even if one of them
    # ends in error or is cancelled. `job_id` fixes this job's id in advance, so that jobs
    # enqueued together can name each other as parents.
    parents: tuple[UUID, ...] = ()
    run_anyway: bool = False
    job_id: UUID | None = None
    # W3C trace context to store with the job (docs/tracing.md); None: the current span's, when
    # tracing is on. A value that is not a valid version 00 traceparent is not stored.
    traceparent: str | None = None

    def checked(self) -> NewJob:
        """Self, or a ValueError saying what is wrong; nothing reaches the database half-valid."""
        if not isinstance(self.payload, Mapping):
            raise ValueError(
                f"payload must be a JSON object (a mapping), got {type(self.payload).__name__}"
            )
        if not self.job_type or not isinstance(self.job_type, str):
            raise ValueError("job_type must be a non-empty string")
        if self.scheduled_for is not None and self.delay_s is not None:
            raise ValueError("give scheduled_for or delay_s, not both")
        if self.scheduled_for is not None and self.scheduled_for.tzinfo is None:
            raise ValueError("scheduled_for must be timezone-aware")
        if not 1 <= self.max_attempts <= SMALLINT_MAX:
            raise ValueError(f"max_attempts must be 1..{SMALLINT_MAX}")
        if self.priority is not None and not -SMALLINT_MAX <= self.priority <= SMALLINT_MAX:
            raise ValueError(f"priority must fit a SMALLINT (±{SMALLINT_MAX})")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        if self.job_id is not None and self.job_id in self.parents:
            raise ValueError("a job cannot depend on itself")
        if type(self.payload) is not dict:
            # Read now, by the caller (a handler's follow-up: its job fails): read later by
            # the outcome writer, a mapping whose reading raises ended the writer, and the
            # worker with it.
            try:
                payload = dict(self.payload)
            except Exception as exc:
                raise ValueError(
                    f"payload could not be read as a mapping: {type(exc).__name__}"
                ) from None
            return dataclasses.replace(self, payload=payload)
        return self


# A key whose holder finishes between our insert and the look-up is tried again; a key that is
# neither insertable nor visible (a holder this connection's row-level security hides) would
# loop forever, so the rounds are bounded.
DUPLICATE_ROUNDS = 5


class UniqueKeyUnresolved(RuntimeError):
    """A job's unique key was held at every insert and its holder never seen at the look-up
    after it, DUPLICATE_ROUNDS times: a holder this connection cannot see (row-level security),
    or holders that kept finishing between the two. No job was enqueued for it."""


async def enqueue_many(conn: store.Conn, jobs: Sequence[NewJob]) -> list[UUID]:
    """Enqueues `jobs` and returns their ids in the same order. A job whose unique key is held
    gets the holder's id instead of a new row. Jobs with `parents` are inserted with their
    edges in one transaction (the caller's, if it has one)."""
    if not jobs:
        return []
    checked = [job.checked() for job in jobs]
    if any(j.parents for j in checked) and isinstance(conn, asyncpg.Connection):
        # The jobs and their edges commit together: a child must never be seen due before
        # its edges hold it.
        async with conn.transaction():
            return await _enqueue_graph(conn, checked)
    if any(j.parents for j in checked):
        async with conn.acquire() as one, one.transaction():
            return await _enqueue_graph(one, checked)
    return await _enqueue_jobs(conn, checked, DUPLICATE_ROUNDS)


async def _enqueue_graph(conn: asyncpg.Connection, checked: list[NewJob]) -> list[UUID]:
    ids = await _enqueue_jobs(conn, checked, DUPLICATE_ROUNDS)
    # A job given an id in advance but deduplicated onto another keeps the holder's id.
    actual = {j.job_id: i for j, i in zip(checked, ids, strict=True) if j.job_id is not None}
    edges = [
        (actual.get(parent, parent), child, j.run_anyway)
        for j, child in zip(checked, ids, strict=True)
        for parent in j.parents
    ]
    await store.add_dependencies(conn, edges)
    return ids


async def _enqueue_jobs(conn: store.Conn, checked: list[NewJob], rounds: int) -> list[UUID]:
    fresh = iter(uuid7s(sum(j.job_id is None for j in checked)))
    ids = [j.job_id if j.job_id is not None else next(fresh) for j in checked]
    rows = store.EnqueueRows(
        ids=ids,
        workspace_ids=[_uuid(j.workspace_id) for j in checked],
        job_types=[j.job_type for j in checked],
        payloads=[j.payload for j in checked],  # dicts: checked() reads any other mapping
        priorities=[
            default_priority(j.job_type) if j.priority is None else j.priority for j in checked
        ],
        scheduled_for=[j.scheduled_for for j in checked],
        delays_s=[j.delay_s for j in checked],
        max_attempts=[j.max_attempts for j in checked],
        unique_keys=[j.unique_key for j in checked],
        timeouts_s=[j.timeout_s for j in checked],
        traceparents=_traceparents(checked),
    )
    if _copyable(checked):
        await store.copy_jobs(conn, rows, with_schedule=checked[0].scheduled_for is not None)
        return ids
    inserted = await store.enqueue(conn, rows)
    if len(inserted) == len(ids):
        return ids
    return await _resolve_duplicates(conn, checked, ids, inserted, rounds)


def _traceparents(jobs: Sequence[NewJob]) -> list[str | None]:
    """Each job's own valid traceparent, else the current span's when tracing is on."""
    current = tracing.current_traceparent() if tracing.ENABLED else None
    return [
        tracing.valid_traceparent(j.traceparent) if j.traceparent is not None else current
        for j in jobs
    ]


COPY_MIN_JOBS = 64  # below this a single INSERT is as quick and one round trip fewer


def _copyable(jobs: Sequence[NewJob]) -> bool:
    """Big batches without dedupe keys or delays (and all or none scheduled) go by COPY,
    about twice as fast as the INSERT ... SELECT FROM unnest it replaces."""
    if len(jobs) < COPY_MIN_JOBS:
        return False
    scheduled = jobs[0].scheduled_for is not None
    return all(
        j.unique_key is None and j.delay_s is None and (j.scheduled_for is not None) == scheduled
        for j in jobs
    )


async def enqueue(
    conn: store.Conn,
    workspace_id: UUID | str,
    job_type: str,
    payload: Mapping[str, Any] | None = None,
    **options: Any,
) -> UUID:
    """Enqueues one job; `options` are NewJob's optional fields."""
    job = NewJob(workspace_id=workspace_id, job_type=job_type, payload=payload or {}, **options)
    return (await enqueue_many(conn, [job]))[0]


async def _resolve_duplicates(
    conn: store.Conn, jobs: Sequence[NewJob], ids: list[UUID], inserted: set[UUID], rounds: int
) -> list[UUID]:
    """Maps each job that was not inserted to the job holding its unique key. If the holder
    finished between our insert and this look-up, the job is enqueued again."""
    result = list(ids)
    missing = [i for i, job_id in enumerate(ids) if job_id not in inserted]
    keys = [(_uuid(jobs[i].workspace_id), jobs[i].unique_key or "") for i in missing]
    holders = await store.find_by_unique_keys(conn, keys)
    again = []
    for i, key in zip(missing, keys, strict=True):
        holder = holders.get(key)
        if holder is None:
            again.append(i)
        else:
            result[i] = holder
    if again and rounds <= 1:
        held = jobs[again[0]].unique_key or ""
        raise UniqueKeyUnresolved(
            f"unique key {held[:200]!r} is held by a job this connection cannot"
            f" see (row-level security?) or by jobs that kept finishing while it was looked up"
            f" ({DUPLICATE_ROUNDS} tries), and no new job can take it"
        )
    if again:
        retried = await _enqueue_jobs(conn, [jobs[i] for i in again], rounds - 1)
        for i, job_id in zip(again, retried, strict=True):
            result[i] = job_id
    return result


def _uuid(value: UUID | str) -> UUID:
    if isinstance(value, UUID):
        return value
    try:
        return UUID(str(value))
    except ValueError:
        raise ValueError(f"workspace_id {value!r} is not a UUID") from None
