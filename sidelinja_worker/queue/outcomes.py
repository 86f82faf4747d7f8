"""Buffers job outcomes and writes them in batches: one statement per kind of outcome.

A flush starts as soon as an outcome arrives and no flush is running, so a lone job is written
at once and a busy worker writes hundreds per statement. If the database is away, outcomes stay
buffered and the flush is retried with backoff. A crash before a flush loses no job: it is still
`running` under this worker's lease, is rescued and runs again (at-least-once)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar
from uuid import UUID

import asyncpg
from asyncpg.exceptions._base import DataError as ArgumentError

from sidelinja_worker.queue import backoff, store
from sidelinja_worker.queue.client import NewJob, UniqueKeyUnresolved, enqueue_many
from sidelinja_worker.queue.db import DB_ERRORS, RawJson
from sidelinja_worker.queue.store import Failure, Release

log = logging.getLogger("sidelinja_worker.outcomes")

RETRY_FIRST_S = 0.05
RETRY_MAX_S = 5.0
FLUSH_TIMEOUT_S = 60.0  # a flush that takes longer is treated as a lost connection, and retried
# A job's row that another session holds locked (the web app's own transaction on its job, left
# open; a `SELECT ... FOR UPDATE` is any role's right on its rows) kept the whole batch's
# statement waiting, so every other workspace's outcomes waited with it, and at a stop were
# lost and their jobs run again. The worker's own sessions wait at most pools.LOCK_WAIT_S for a
# lock; a batch that waited so long is written row by row, each row waiting ROW_LOCK_WAIT_S,
# and a row still locked is held back and tried alone, first after HELD_FIRST_S, then twice as
# long each time up to HELD_MAX_S, so that it never stalls a batch again.
ROW_LOCK_WAIT_MS = 100
HELD_FIRST_S = 0.5
HELD_MAX_S = 30.0
# An outcome's statement also releases or cancels its job's graph children, ~35 µs each, so a
# parent of 300,000 children outlasts the statements' usual timeout. With that timeout fixed,
# its completion failed at every try, every outcome buffered behind it waited for ever, and the
# worker's heartbeat kept its jobs from the rescue. A flush that times out is tried again with
# twice the time (store.longer_timeout), and the next flush that succeeds starts over.


class OutcomeWriter:
    def __init__(
        self, pool: asyncpg.Pool, worker_id: UUID, timeout_s: float = store.STATEMENT_TIMEOUT_S
    ) -> None:
        self.worker_id = worker_id
        self._pool = pool
        self._base_timeout_s = self._timeout_s = timeout_s
        self._done: list[tuple[UUID, RawJson]] = []
        self._follow_ups: dict[UUID, list[NewJob]] = {}
        self._failed: list[Failure] = []
        self._released: list[Release] = []
        self._cancelled: list[UUID] = []
        self._inflight: set[UUID] = set()
        # Outcomes whose row another session held locked: job id -> (when to try it again,
        # alone, on the monotonic clock; the wait before that).
        self._held: dict[UUID, tuple[float, float]] = {}
        # Counts `discard`s: a flush in flight across one puts nothing back.
        self._generation = 0
        self._arrived = asyncio.Event()
        self._empty = asyncio.Event()
        self._empty.set()

    def use_pool(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    def completed(
        self, job_id: UUID, result: RawJson, follow_ups: list[NewJob] | None = None
    ) -> None:
        done = self._done
        done.append((job_id, result))
        if follow_ups:
            self._follow_ups[job_id] = follow_ups
        if len(done) == 1:  # a flush takes the whole list, so only the first needs the signal
            self._note()

    def failed(self, failure: Failure) -> None:
        self._failed.append(failure)
        self._note()

    def released(self, release: Release) -> None:
        self._released.append(release)
        self._note()

    def cancelled(self, job_id: UUID) -> None:
        self._cancelled.append(job_id)
        self._note()

    def _note(self) -> None:
        self._empty.clear()
        self._arrived.set()

    async def _complete(
        self, conn: asyncpg.Connection, owner: UUID, done: list[tuple[UUID, RawJson]]
    ) -> None:
        """Completions; a job's follow-up jobs commit in the same transaction, and only for the
        jobs this statement really completed (not one rescued from us meanwhile)."""
        if not self._follow_ups or not any(job_id in self._follow_ups for job_id, _ in done):
            await store.complete_quietly(conn, owner, done, self._timeout_s)
            return
        async with conn.transaction():
            completed = await store.complete(conn, owner, done, self._timeout_s)
            jobs = [job for job_id in completed for job in self._follow_ups.get(job_id, ())]
            if jobs:
                await enqueue_many(conn, jobs)
        for job_id, _ in done:
            self._follow_ups.pop(job_id, None)

    def discard(self) -> None:
        """Forget buffered outcomes: their jobs were rescued from us and may run elsewhere. A
        flush in flight finishes under the worker id it started with, and what it fails to
        write is dropped too, not tried again under the worker's next id: by then that
        worker may have claimed the same job again, and the old run's outcome would end the
        new run's job."""
        self._done, self._failed, self._released, self._cancelled = [], [], [], []
        self._follow_ups.clear()
        self._held.clear()
        self._generation += 1
        self._empty.set()

    def owned_ids(self) -> set[UUID]:
        """Jobs whose outcome is buffered or being written: finished here, not yet in the table."""
        owned = {d[0] for d in self._done} | {f.job_id for f in self._failed}
        owned |= {r.job_id for r in self._released} | set(self._cancelled) | self._inflight
        return owned

    def pending(self) -> int:
        return len(self._done) + len(self._failed) + len(self._released) + len(self._cancelled)

    def unwritten(self) -> bool:
        """Whether any outcome is buffered or being written (not yet committed): a completion
        in flight may carry follow-up jobs that are not in the table yet."""
        return bool(self.pending() or self._inflight)

    async def run(self) -> None:
        """Flushes until cancelled; cancel it only after `drain`."""
        delay = RETRY_FIRST_S
        while True:
            await self._arrived.wait()
            self._arrived.clear()
            try:
                # Every statement of a flush is bounded (store.STATEMENT_TIMEOUT_S) but the
                # follow-up enqueue, which runs in the completion's transaction: this bounds it.
                async with asyncio.timeout(max(FLUSH_TIMEOUT_S, 4 * self._timeout_s)):
                    await self._flush()
                delay, self._timeout_s = RETRY_FIRST_S, self._base_timeout_s
                if self._held:
                    wait_s = min(due for due, _ in self._held.values()) - time.monotonic()
                    asyncio.get_running_loop().call_later(max(wait_s, 0.0), self._arrived.set)
            except DB_ERRORS as exc:
                if isinstance(exc, TimeoutError):
                    self._timeout_s = store.longer_timeout(self._timeout_s)
                log.warning(
                    "writing %d job outcomes failed (%s); retrying in %.2fs with %gs a statement",
                    self.pending(),
                    exc if str(exc) else type(exc).__name__,
                    delay,
                    self._timeout_s,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)
                self._arrived.set()

    async def drain(self, timeout_s: float) -> bool:
        """Waits until every buffered outcome is written; False if that took over timeout_s."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._empty.wait()
            return True
        except TimeoutError:
            return False

    async def _flush(self) -> None:
        owner, generation = self.worker_id, self._generation
        done, done_alone, self._done = self._split(self._done, _done_id)
        failed, failed_alone, self._failed = self._split(self._failed, _failure_id)
        released, released_alone, self._released = self._split(self._released, _release_id)
        cancelled, cancelled_alone, self._cancelled = self._split(self._cancelled, _same_id)
        done += done_alone
        failed += failed_alone
        released += released_alone
        cancelled += cancelled_alone
        self._inflight = (
            {d[0] for d in done}
            | {f.job_id for f in failed}
            | {r.job_id for r in released}
            | set(cancelled)
        )
        try:
            async with self._pool.acquire() as conn:
                if done:
                    done = await self._isolated(
                        conn, owner, "result", done, len(done_alone), self._complete, _done_id
                    )
                if failed:
                    failed = await self._isolated(
                        conn, owner, "failure", failed, len(failed_alone), self._fail, _failure_id
                    )
                if released:
                    released = await self._isolated(
                        conn,
                        owner,
                        "deferral",
                        released,
                        len(released_alone),
                        self._release,
                        _release_id,
                    )
                if cancelled:
                    cancelled = await self._isolated(
                        conn,
                        owner,
                        "cancellation",
                        cancelled,
                        len(cancelled_alone),
                        self._cancel,
                        _same_id,
                    )
        finally:
            self._inflight = set()
            if generation != self._generation:  # discarded meanwhile: see `discard`
                done, failed, released, cancelled = [], [], [], []
            # What was not written goes back to the front of the buffers for the next try.
            self._done[:0] = done
            self._failed[:0] = failed
            self._released[:0] = released
            self._cancelled[:0] = cancelled
            if not self.pending():
                self._empty.set()

    def _split(
        self, items: list[T], job_id: Callable[[T], UUID]
    ) -> tuple[list[T], list[T], list[T]]:
        """`items` as (the batch, the held ones due to be tried alone, the held ones not yet
        due). With nothing held, as on every ordinary flush, the batch is `items` itself."""
        if not self._held:
            return items, [], []
        now = time.monotonic()
        batch: list[T] = []
        alone: list[T] = []
        later: list[T] = []
        for item in items:
            held = self._held.get(job_id(item))
            (batch if held is None else alone if held[0] <= now else later).append(item)
        return batch, alone, later

    async def _fail(self, conn: asyncpg.Connection, owner: UUID, failed: list[Failure]) -> None:
        await store.fail(conn, owner, failed, self._timeout_s)

    async def _release(
        self, conn: asyncpg.Connection, owner: UUID, released: list[Release]
    ) -> None:
        await store.release(conn, owner, released, self._timeout_s)

    async def _cancel(self, conn: asyncpg.Connection, owner: UUID, cancelled: list[UUID]) -> None:
        await store.mark_cancelled(conn, owner, cancelled, self._timeout_s)

    async def _isolated(
        self,
        conn: asyncpg.Connection,
        owner: UUID,
        what: str,
        items: list[T],
        alone: int,
        write: Callable[[asyncpg.Connection, UUID, list[T]], Awaitable[None]],
        job_id: Callable[[T], UUID],
    ) -> list[T]:
        """Writes `items` as worker `owner`: all but the last `alone` (held back before, see
        ROW_LOCK_WAIT_MS) in one statement, those one by one. If PostgreSQL refuses the batch
        for its values (a NUL in text, `\\u0000` in JSON, a number out of range, a value too
        big), or a job's follow-up could not be enqueued (its unique key unresolved), or a row
        was locked past pools.LOCK_WAIT_S, it writes them row by row, and each row refused
        again ends its job in `error` saying what was wrong with its outcome, or, for the
        follow-up, fails its attempt (the holders' race may be over at the next). So one bad
        outcome never holds up the others, nor stops this writer. Returns the items whose row
        was still locked, held back to be tried alone later. A lost connection is not a bad
        value: it raises, and the whole flush is tried again."""
        batch, one_by_one = items[: len(items) - alone], items[len(items) - alone :]
        if batch:
            try:
                await write(conn, owner, batch)
                batch = []
            except Exception as exc:
                locked = isinstance(exc, asyncpg.LockNotAvailableError)
                if not (locked or refused_value(exc) or isinstance(exc, UniqueKeyUnresolved)):
                    raise
                log.warning(
                    "a batch of %d job outcomes was %s (%s); writing them one by one",
                    len(batch),
                    "held up by a locked row" if locked else "refused",
                    one_line(exc),
                )
        refused: list[Failure] = []
        kept: list[T] = []
        for item in batch + one_by_one:
            try:
                async with conn.transaction():
                    await conn.execute(f"SET LOCAL lock_timeout = '{ROW_LOCK_WAIT_MS}ms'")
                    await write(conn, owner, [item])
                self._held.pop(job_id(item), None)
            except asyncpg.LockNotAvailableError:
                kept.append(item)
            except UniqueKeyUnresolved as exc:
                message = f"its follow-up jobs could not be enqueued: {one_line(exc)}"
                log.error("job %s: %s", job_id(item), message)
                self._follow_ups.pop(job_id(item), None)
                refused.append(
                    Failure(job_id(item), "transient", clean(message), False, backoff.BASE_S)
                )
            except Exception as exc:
                if not refused_value(exc):
                    raise
                message = f"its {what} could not be stored: {one_line(exc)}"
                log.error("job %s: %s", job_id(item), message)
                self._follow_ups.pop(job_id(item), None)
                refused.append(Failure(job_id(item), "bad_outcome", clean(message), True, 0.0))
        for failure in refused:  # the stand-in outcome is ours, plain text: refused, give up
            try:
                await store.fail(conn, owner, [failure], self._timeout_s)
            except Exception as exc:
                if not refused_value(exc):
                    raise
                log.error(
                    "job %s: not even its error could be stored (%s); the lease rescues it",
                    failure.job_id,
                    one_line(exc),
                )
        self._hold(kept, job_id)
        return kept

    def _hold(self, kept: list[T], job_id: Callable[[T], UUID]) -> None:
        now = time.monotonic()
        for item in kept:
            _, wait_s = self._held.get(job_id(item), (0.0, HELD_FIRST_S / 2))
            wait_s = min(wait_s * 2, HELD_MAX_S)
            self._held[job_id(item)] = (now + wait_s, wait_s)
            log.warning(
                "job %s: its row is locked by another session; its outcome waits %g s",
                job_id(item),
                wait_s,
            )


T = TypeVar("T")


def _done_id(item: tuple[UUID, RawJson]) -> UUID:
    return item[0]


def _failure_id(item: Failure) -> UUID:
    return item.job_id


def _release_id(item: Release) -> UUID:
    return item.job_id


def _same_id(item: UUID) -> UUID:
    return item


def refused_value(exc: BaseException) -> bool:
    """Whether a write failed because of the values sent, not the connection: PostgreSQL's
    own errors (a data exception, a limit exceeded, ...) other than a lost or shut-down
    server, and asyncpg's refusal to encode an argument."""
    if isinstance(exc, ArgumentError):
        return True
    return isinstance(exc, asyncpg.PostgresError) and not isinstance(exc, DB_ERRORS)


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())[:300]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def clean(message: str) -> str:
    return message.replace("\x00", "\\0").encode("utf-8", "replace").decode("utf-8")
