"""The worker: claim loop, concurrency bound, wake-up, heartbeat, graceful stop, burst mode."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
import time
from collections import deque
from collections.abc import Callable, Coroutine
from importlib import metadata
from typing import Any
from uuid import UUID, uuid4

import asyncpg

from sidelinja_worker.queue import executor, metrics, store, threads, tracing
from sidelinja_worker.queue.analyze import analyze_loop
from sidelinja_worker.queue.cancels import CancelNotices
from sidelinja_worker.queue.config import ServiceConfig
from sidelinja_worker.queue.context import Services, clean_text
from sidelinja_worker.queue.db import DB_ERRORS, session_name
from sidelinja_worker.queue.errors import UserError
from sidelinja_worker.queue.jobs import ClaimedJob
from sidelinja_worker.queue.limits import LimitsCache, RateLimiter
from sidelinja_worker.queue.listener import Listener
from sidelinja_worker.queue.maintenance import prune_loop, rescue_loop
from sidelinja_worker.queue.outcomes import OutcomeWriter, one_line
from sidelinja_worker.queue.pools import open_claim_pool, open_lease_pool
from sidelinja_worker.queue.prefetch import claim_size, prefetch
from sidelinja_worker.queue.registry import JobType, Registry
from sidelinja_worker.queue.settings import WorkerSettings
from sidelinja_worker.queue.store import Release

log = logging.getLogger("sidelinja_worker.worker")

CLAIM_RETRY_MAX_S = 5.0
TIMEOUT_TICK_S = 0.05  # how late a timeout may fire
# A wake-up is a hint that any role can send (NOTIFY): after a claim that found nothing, the
# next one waits until this long after it, so a stream of wake-ups costs a worker at most 200
# empty claims a second (one per notification before: ~1,800 a second), and a job inserted
# right after an empty claim is picked up at most this much later.
EMPTY_CLAIM_GAP_S = 0.005
DRAIN_AT_EXIT_S = 10.0
HEARTBEAT_RETRY_S = 0.5  # the next heartbeat after a failed one, at the latest
LOST_LEASE = "lost-lease"
# After an internal task dies, the worker gives back what it can within this and raises
# WorkerDied: the process exits non-zero within ~5 s and its process manager restarts it.
DIE_WITHIN_S = 4.0
LAG_TICK_S = 0.5  # how often the event loop's lag is measured
THREAD_WATCH_S = 1.0  # how often thread work left behind by ended jobs is counted
# Thread work of a job that ended (cancelled, timed out) that runs on this much longer is
# taken for stuck: such work normally ends within seconds of its job.
THREAD_STUCK_S = 60.0
# A handler still running this long past its timeout has ignored the cancellation (it catches
# CancelledError and goes on): its slot never comes back, and the lease it renews keeps its
# job from any other worker. The worker dies (crash-only) and its jobs go back, counted.
HANDLER_OVERRUN_S = 60.0
# Jobs claimed ahead (prefetch) wait for a slot. A claim of short jobs that brought a few long
# ones filled every slot with those, and the held jobs of every workspace waited behind them
# for as long as they ran (hours, by their timeouts) while other workers had nothing to do.
# Held jobs go back to the queue, their attempts returned, once every slot has been busy and
# no job has started for this long; the worker then claims nothing ahead until its jobs are
# short again.
HELD_WAIT_S = 1.0
# At a stop, handlers cancelled once the grace period is over have this long to end; past it,
# the worker dies as above instead of waiting for them for ever.
CANCELLED_WITHIN_S = 10.0
# Exit codes (README, "Exit codes"): 0 stopped or drained, 1 a second stop signal, 2 bad input
# or no database, 3 an internal task of the worker died (restart it: the leases rescue its jobs).
EXIT_WORKER_DIED = 3


class ThreadsLeftBehind(Exception):
    """Too many threads held by work of jobs that have ended (Worker._thread_watch)."""


class CancellationIgnored(Exception):
    """A handler went on past its cancellation (Worker._timeout_watchdog, a stop)."""


class WorkerDied(Exception):
    """An internal task of the worker (claim loop, outcome writer, heartbeat, listener,
    watchdogs, maintenance) ended with an unexpected error. The worker stopped heartbeating at
    once, gave back the jobs it had claimed but not started, handed the rest to the lease
    rescue and stopped: crash-only. `run` exits with code 3."""

    def __init__(self, task: str, error: BaseException) -> None:
        detail = " ".join(str(error).split())[:300]
        super().__init__(
            f"internal task {task!r} died: {type(error).__name__}"
            + (f": {detail}" if detail else "")
        )
        self.task = task
        self.error = error


class Worker:
    """Runs jobs of `settings.job_types` (default: all of `registry`) until stopped, or, in
    burst mode, until no due job is left."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        database_url: str,
        registry: Registry,
        settings: WorkerSettings,
        config: ServiceConfig | None = None,
    ) -> None:
        unknown = sorted(set(settings.job_types) - set(registry))
        if unknown:
            raise ValueError(f"unknown job types {unknown}; known: {sorted(registry)}")
        self.settings = settings
        self.id = uuid4()
        self.job_types = list(settings.job_types or registry)
        self._pool = pool
        self._url = database_url
        self._registry = registry
        # Each type with its timeout under the worker's cap, for a job's start: a plain dict,
        # as Registry.get (a Mapping's) and executor.timeout_for are Python calls per job.
        self._types: dict[str, tuple[JobType, float]] = {
            name: (jt, executor.timeout_for_type(jt, settings.max_timeout_s))
            for name, jt in registry.items()
        }
        self._running: dict[UUID, asyncio.Task[None]] = {}
        self._ready: deque[ClaimedJob] = deque()  # claimed, not started (prefetch)
        self._deadlines: dict[UUID, float] = {}  # job id -> monotonic time its timeout ends
        self._job_ready = asyncio.Event()  # wakes the slots: a held job is waiting
        self._job_time_s = 1.0  # moving average of handler run time; starts "long"
        self._started_s = 0.0  # when the last job started (monotonic)
        self._cancel_reasons: dict[UUID, str] = {}
        self._wake = asyncio.Event()
        self._slot_freed = asyncio.Event()
        self._stop = asyncio.Event()
        self.draining = False  # an operator asked it to finish its jobs and claim no more
        self._lease_deadline = 0.0
        # When the heartbeats began to get through again after failing (None: failing now).
        # The rescue declares no worker dead until a lease has passed since (may_declare_dead).
        self._reached_since: float | None = -math.inf
        # Held while a claim is in flight and its jobs are being started, so the heartbeat's
        # reconciliation never mistakes a job on its way here for a lost one.
        self._claim_lock = asyncio.Lock()
        # Claims and outcome writes run on a pool of their own with generic plans, and the
        # lease's bookkeeping on a connection of its own (`run` opens both); handlers and
        # maintenance use `pool`.
        self._queue_pool = pool
        self._lease_pool = pool
        self._writer = OutcomeWriter(pool, self.id)
        self._limits = LimitsCache(pool, job_types=self.job_types)
        self._config = config or ServiceConfig.from_env()
        self._services: Services | None = None
        self.claimed_total = 0
        self._blocked_checks = 0
        # Supervision: every internal task, and the first unexpected death among them.
        self._tasks: list[asyncio.Task[None]] = []
        self._fatal: WorkerDied | None = None
        self._died = asyncio.Event()
        self._extra: list[tuple[str, Callable[[], Coroutine[Any, Any, None]]]] = []
        self._cancel_notices = CancelNotices(self._runs_here, self._cancel_requested, self._cancel)
        self._empty_claim_at = -EMPTY_CLAIM_GAP_S  # loop time a claim last came back empty
        self.claims_made = 0  # claim statements sent

    def supervise_also(self, name: str, factory: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """One more task to run, under the same supervision, while the worker runs (the
        metrics server's gauge refresh, say)."""
        self._extra.append((name, factory))

    # -- control ---------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Stop claiming; running jobs get the grace period (SIGTERM/SIGINT)."""
        if not self._stop.is_set():
            log.info(
                "stopping: no new jobs; waiting up to %gs for %d running",
                self.settings.grace_s,
                len(self._running),
            )
        self._stop.set()
        self._wake.set()
        self._job_ready.set()

    def wake(self) -> None:
        self._wake.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def running_count(self) -> int:
        return len(self._running)

    async def run(self) -> None:
        threads.size_default_pool(self.settings.max_concurrent)
        try:
            await self._limits.load()
        except DB_ERRORS as exc:  # the limits loop reads them again shortly
            log.warning("limits not read yet (%s)", exc)
        # One HTTP client for every handler (built in a thread below): shared connection
        # pools. Service clients set their own per-request timeouts.
        self._services = Services(self._pool, None, self._config, RateLimiter(self._pool))
        try:
            self._queue_pool = await open_claim_pool(self._url, self.job_types)
        except UserError as exc:  # the shared pool works: go on with it, plans left to choose
            log.warning("no pool for claims (%s); using the shared one", exc)
        self._writer.use_pool(self._queue_pool)
        try:
            self._lease_pool = await open_lease_pool(self._url)
        except UserError as exc:  # go on; handlers holding every connection delay heartbeats
            log.warning("no connection for the lease (%s); using the shared pool", exc)
        tracing.start(_version())  # off unless OTEL_* variables ask for traces
        http_ready = asyncio.create_task(self._prepare_http(), name="http-client")
        try:
            await self._run()
        finally:
            await http_ready  # a thread's few milliseconds; its client must be closed below
            tracing.stop()  # every job's span has ended: send what is queued, bounded
            # The last seconds' counts for the dashboard, if the database answers at once.
            with contextlib.suppress(*metrics.MINUTE_ERRORS):
                await asyncio.wait_for(metrics.flush_minutes(self._pool), 1.0)
            await self._services.aclose()
            for own in (self._queue_pool, self._lease_pool):
                if own is not self._pool:
                    await own.close()

    async def _prepare_http(self) -> None:
        """The handlers' HTTP client, built off the loop; a failure here is logged, and the
        first handler to ask builds it (and meets the error itself)."""
        assert self._services is not None
        try:
            await self._services.prepare_http()
        except Exception:
            log.warning("HTTP client not prepared in advance", exc_info=True)

    async def _run(self) -> None:
        await self._register()
        loop_tasks = [
            self._supervise(self._limits.run(), "limits"),
            self._supervise(self._writer.run(), "outcomes"),
            self._supervise(self._heartbeat_loop(), "heartbeat"),
            self._supervise(self._timeout_watchdog(), "timeouts"),
            self._supervise(self._held_watch(), "held jobs"),
            self._supervise(self._thread_watch(), "threads"),
            self._supervise(
                rescue_loop(self._pool, self.settings, may_reap=self.may_declare_dead), "rescue"
            ),
            self._supervise(prune_loop(self._pool, self.settings), "prune"),
            self._supervise(analyze_loop(self._pool), "analyze"),
            self._supervise(metrics.lag_loop(LAG_TICK_S), "loop-lag"),
            self._supervise(metrics.minute_loop(self._pool), "minute-stats"),
        ]
        loop_tasks += [self._supervise(factory(), name) for name, factory in self._extra]
        if self.settings.listen:
            listener = Listener(self._url, self.wake, self._on_cancel_notice, self._limits.changed)
            loop_tasks.append(self._supervise(listener.run(), "listen"))
        slots = [
            self._supervise(self._slot(), f"slot-{i}") for i in range(self.settings.max_concurrent)
        ]
        claim = self._supervise(self._claim_loop(), "claim")
        died = asyncio.ensure_future(self._died.wait())
        try:
            await asyncio.wait([claim, died], return_when=asyncio.FIRST_COMPLETED)
        finally:
            died.cancel()
            if self._fatal is None:
                await self._shutdown(slots, loop_tasks)
        if self._fatal is not None:
            await self._die(slots, [*loop_tasks, claim])
            raise self._fatal

    def _supervise(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(coro, name=name)
        task.add_done_callback(self._task_ended)
        self._tasks.append(task)
        return task

    def _task_ended(self, task: asyncio.Task[None]) -> None:
        """Every internal task runs until the worker stops; the claim loop and the slots end
        on a stop (or a drained burst). Any other end is a death: one error line, no more
        heartbeats from this moment, and the worker winds down (`_die`)."""
        if task.cancelled() or self._fatal is not None:
            return
        error = task.exception()
        if error is None:
            name = task.get_name()
            if name == "claim" or (name.startswith("slot-") and self._stop.is_set()):
                return
            error = RuntimeError("ended unexpectedly")
        self._fatal = WorkerDied(task.get_name(), error)
        log.error(
            "%s; giving back its jobs and exiting", self._fatal, exc_info=(type(error), error, None)
        )
        for other in self._tasks:
            if other.get_name() == "heartbeat":
                other.cancel()  # the lease must run out: this worker cannot finish jobs
        self._lease_deadline = 0.0  # starts nothing more
        self._stop.set()
        self._wake.set()
        self._job_ready.set()
        self._slot_freed.set()
        self._died.set()

    async def _die(self, slots: list[asyncio.Task[None]], others: list[asyncio.Task[None]]) -> None:
        """After a death: stop every task, cancel the handlers (they give their jobs back
        through the outcome writer, if it lives, which writes what it still can), give back
        the jobs claimed but not started (their attempt returned), and hand whatever still
        runs under this worker to the queue at once, counted as an attempt (so a job that kills
        workers ends in `error` after max_attempts). Bounded by DIE_WITHIN_S; whatever is not
        given back by then is rescued when the lease expires. A handler that ignores its
        cancellation is not waited for."""
        writer = next((t for t in others if t.get_name() == "outcomes"), None)
        claim = next((t for t in others if t.get_name() == "claim"), None)
        for task in others:
            if task is not writer:
                task.cancel()
        for job_id, task in list(self._running.items()):
            self._cancel_reasons.setdefault(job_id, executor.SHUTDOWN)
            task.cancel()
        try:
            async with asyncio.timeout(DIE_WITHIN_S):
                # A claim cancelled in flight ends once its statement has (the pool waits for
                # the connection to be idle before taking it back). Jobs it took are by then
                # this worker's `running` rows, which abandon_worker below hands back; its
                # answer, lost with the cancel, never reached _ready. Without this wait, a
                # claim that committed after abandon_worker left its jobs to the lease rescue.
                if claim is not None and not claim.done():
                    await asyncio.wait([claim], timeout=DIE_WITHIN_S / 4)
                ready = [Release(job.id, None) for job in self._ready]
                self._ready.clear()
                if slots:
                    await asyncio.wait(slots, timeout=DIE_WITHIN_S / 4)
                if writer is not None and not writer.done():
                    await self._writer.drain(DIE_WITHIN_S / 4)
                if ready:
                    await store.release(self._lease_pool, self.id, ready)
                # A batch at a time, and the worker row goes only once all are back: rows
                # left when the time is up stay this worker's, for the rescue to find once
                # its lease expires.
                abandoned = await store.abandon_worker(
                    self._lease_pool, self.id, clean_text(str(self._fatal), 500)
                )
                if abandoned:
                    log.warning("handed %d running jobs to the rescue", len(abandoned))
                await store.unregister_worker(self._lease_pool, self.id)
        except (TimeoutError, *DB_ERRORS, asyncpg.PostgresError) as exc:
            log.warning("could not give everything back (%s); the lease covers the rest", exc)
        finally:
            if writer is not None:
                writer.cancel()
            unfinished = [t for t in (*slots, *others) if not t.done()]
            if unfinished:
                await asyncio.wait(unfinished, timeout=0.5)

    # -- claiming --------------------------------------------------------------------------

    async def _claim_loop(self) -> None:
        retry_s = 0.05
        loop = asyncio.get_running_loop()
        while not self._stop.is_set():
            want = (
                self.settings.max_concurrent
                - len(self._running)
                - len(self._ready)
                + self._prefetch()
            )
            if want <= 0:
                # Until a slot frees (a job ends, held jobs are dropped): every path that
                # frees one sets the event. The poll interval bounds the wait all the same:
                # a path that forgot to left the worker claiming nothing for the rest of
                # its life.
                self._slot_freed.clear()
                await self._wait_for(self._slot_freed, self.settings.poll_interval_s)
                continue
            if loop.time() >= self._lease_deadline or self.draining:  # start nothing new
                await self._wait_for(self._stop, self.settings.poll_interval_s)
                continue
            self._wake.clear()
            try:
                jobs = await self._claim(min(want, self._claim_size()))
                # Drained in burst mode, once nothing we hold was lost on the way here (if it
                # was, it is due again now: run it rather than strand it).
                if self.settings.burst and not jobs and not self._running and not self._ready:
                    # A completion buffered or being written may carry follow-up jobs that
                    # are not in the table yet: drained only once it has committed.
                    if self._writer.unwritten():
                        await self._drain_unless_dead(DRAIN_AT_EXIT_S)
                        continue
                    if await self._give_back_lost():
                        continue
                    if await self._drained():
                        return
                retry_s = 0.05
            except DB_ERRORS as exc:
                log.warning("claim failed (%s); retrying in %.2fs", one_line(exc), retry_s)
                await self._wait_for(self._stop, retry_s)
                retry_s = min(retry_s * 2, CLAIM_RETRY_MAX_S)
                continue
            if jobs:
                self._blocked_checks = 0
                continue  # maybe more (a claim can come back short when workers contend)
            self._empty_claim_at = loop.time()
            if self.settings.burst:
                # A running job may enqueue more (whisper -> srt_parse): look again when it ends.
                self._slot_freed.clear()
                await self._wait_for(self._slot_freed, self.settings.poll_interval_s, self._wake)
            else:
                await self._idle(self.settings.poll_interval_s)
            await self._space_empty_claims()

    async def _space_empty_claims(self) -> None:
        """Waits out EMPTY_CLAIM_GAP_S after the last empty claim (see there)."""
        wait_s = self._empty_claim_at + EMPTY_CLAIM_GAP_S - asyncio.get_running_loop().time()
        if wait_s > 0:
            await self._wait_for(self._stop, wait_s)

    async def _idle(self, timeout_s: float) -> None:
        """Until woken (a NOTIFY, a stop: request_stop wakes too) or `timeout_s`. One future on
        one event, so the claim for a new job is sent in the loop turn after its notification
        arrives (the general `_wait_for` races several, and took turns more)."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._wake.wait()
        except TimeoutError:
            pass

    async def _drained(self) -> bool:
        """Burst mode's end: no due job, or due jobs that nothing running will ever free (a cap
        of 0, say: seen twice in a row, so a slot freed between our claim and this look is
        not mistaken for one). Due jobs behind a cap held by a running job are waited for."""
        due, running = await store.queue_state(self._lease_pool, self.job_types)
        if due and not running:
            self._blocked_checks += 1
            return self._blocked_checks >= 2
        self._blocked_checks = 0
        return not due

    def _prefetch(self) -> int:
        return prefetch(
            self.settings.max_concurrent, self._job_time_s, self._limits.capped(self.job_types)
        )

    def _claim_size(self) -> int:
        return claim_size(self.settings.max_concurrent, self._prefetch())

    async def _claim(self, want: int) -> list[ClaimedJob]:
        async with self._claim_lock:
            self.claims_made += 1
            capped = self._limits.capped(self.job_types)
            fair = self._limits.current.fair
            if not capped and not fair:
                jobs = await store.claim(self._queue_pool, self.id, want, self.job_types)
            else:
                async with self._queue_pool.acquire() as conn:
                    jobs = await store.claim_with_limits(
                        conn,
                        self.id,
                        want,
                        self.job_types,
                        fair,
                        capped,
                        type_capped=self._limits.type_capped(self.job_types),
                    )
            self._ready.extend(sorted(jobs, key=lambda j: -j.priority))
            self.claimed_total += len(jobs)
        if jobs:
            self._job_ready.set()
        return jobs

    async def _slot(self) -> None:
        """One of --max-concurrent long-lived runners, each taking held jobs one after another:
        at most that many handlers run at once. A task per job cost 30 of the 42 us a noop job
        took in the executor's micro-benchmark."""
        slot_task = asyncio.current_task()
        assert slot_task is not None
        # Looked up once: asyncio.get_running_loop() makes a getpid() system call on Python
        # 3.11 (its fork check), which a per-job look-up paid for every job.
        clock = asyncio.get_running_loop().time
        while True:
            job = self._held_job(clock())
            if job is not None:
                await self._run_job(job, slot_task)
            elif self._stop.is_set():
                return
            else:
                self._job_ready.clear()
                try:
                    await self._job_ready.wait()
                except asyncio.CancelledError:
                    if self._stop.is_set():
                        raise
                    # No cancellation of the worker's reaches an idle slot: a handler's timer
                    # or task cancelled the task it ran in after it returned. The slot ended
                    # without a word before, one fewer for good (none: a wedged worker).
                    slot_task.uncancel()
                    name = slot_task.get_name()
                    log.warning("%s was cancelled by a handler's leftover; it goes on", name)

    def _held_job(self, now: float) -> ClaimedJob | None:
        """The next held job, if one may start at loop time `now`: none once stopping, and none
        once the lease has lapsed (the job may be rescued and run elsewhere)."""
        if self._ready and not self._stop.is_set() and now < self._lease_deadline:
            return self._ready.popleft()
        return None

    async def _run_job(self, job: ClaimedJob, slot_task: asyncio.Task[None]) -> None:
        if job.id in self._running:
            # Claimed again while it runs here: plain SQL set its row back to pending, and this
            # worker took it. The row is this worker's, so the run under way writes its
            # outcome; a second run would share the first's entries below and end the slot.
            return
        metrics.picked_up(job.job_type, job.waited_s)
        metrics.CURRENT_JOB.set((job.workspace_id, job.job_type))
        threads.OWNER.set((self.id, job.id))
        known = self._types.get(job.job_type)
        jt: JobType | None
        if known is not None and job.timeout_s is None:
            jt, timeout_s = known
        else:  # a timeout of its own, or a type this worker does not know
            jt = self._registry.get(job.job_type)
            timeout_s = executor.timeout_for(job, jt, self.settings.max_timeout_s)
        self._started_s = started = time.monotonic()
        self._deadlines[job.id] = started + timeout_s
        self._running[job.id] = slot_task  # cancelling it cancels this job (see executor)
        try:
            assert self._services is not None
            await executor.execute(
                job, jt, self._writer, self._services, self.id, timeout_s, self._cancel_reasons
            )
        finally:
            while slot_task.cancelling():  # a cancellation the handler swallowed: spent
                slot_task.uncancel()
            self._job_time_s += (time.monotonic() - started - self._job_time_s) * 0.1
            del self._running[job.id]
            del self._deadlines[job.id]
            if self._cancel_reasons:
                self._cancel_reasons.pop(job.id, None)
            self._slot_freed.set()

    async def _jobs_done(self, timeout_s: float) -> bool:
        """Waits until no handler runs; False if some still did after timeout_s."""
        deadline = time.monotonic() + timeout_s
        while self._running and time.monotonic() < deadline:
            self._slot_freed.clear()
            try:
                async with asyncio.timeout(deadline - time.monotonic()):
                    await self._slot_freed.wait()
            except TimeoutError:
                break
        return not self._running

    async def _wait_for(
        self,
        event: asyncio.Event,
        timeout_s: float | None = None,
        also: asyncio.Event | None = None,
    ) -> None:
        """Until `event` (or `also`, or a stop) is set, or `timeout_s` passes."""
        waits = [asyncio.ensure_future(event.wait()), asyncio.ensure_future(self._stop.wait())]
        if also is not None:
            waits.append(asyncio.ensure_future(also.wait()))
        try:
            await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    # -- leases and cancellation -----------------------------------------------------------

    async def _register(self) -> None:
        """Joins the workers table; retried with backoff while the database is away."""
        loop = asyncio.get_running_loop()
        retry_s = 0.05
        while True:
            sent = loop.time()
            try:
                await store.register_worker(
                    self._lease_pool,
                    self.id,
                    socket.gethostname(),
                    os.getpid(),
                    self.job_types,
                    self.settings.lease_s,
                    _version(),
                    self.settings.max_concurrent,
                    session_name(),
                )
                break
            except DB_ERRORS as exc:
                log.warning(
                    "cannot register with the database (%s); retrying in %.2fs", exc, retry_s
                )
                await asyncio.sleep(retry_s)
                retry_s = min(retry_s * 2, CLAIM_RETRY_MAX_S)
        self._lease_deadline = sent + self.settings.lease_s
        log.info(
            "worker %s started: types %s, max %d at once",
            self.id,
            ",".join(self.job_types),
            self.settings.max_concurrent,
        )

    def may_declare_dead(self) -> bool:
        """Whether this worker's rescue may declare other workers dead: not until a lease has
        passed since its own heartbeats got through again. While the database was out of reach
        (a failover, a restart, the network) no worker could renew its lease, and every lease
        may have run out meanwhile; the first worker back reaped all the others, and every job
        running anywhere was taken from the worker running it and run a second time. A worker
        that was out of reach gives the others one lease to renew theirs."""
        since = self._reached_since
        return since is not None and asyncio.get_running_loop().time() - since >= (
            self.settings.lease_s
        )

    async def _heartbeat_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            # After a failure the next try comes soon: a lease that ran low while the database
            # was out of reach is renewed as soon as it is back, not an interval later.
            interval_s = self.settings.heartbeat_interval_s
            failing = self._reached_since is None
            await asyncio.sleep(min(interval_s, HEARTBEAT_RETRY_S) if failing else interval_s)
            sent = loop.time()
            try:
                drain = await store.heartbeat(self._lease_pool, self.id, self.settings.lease_s)
                if self._reached_since is None:
                    self._reached_since = sent
                    log.warning(
                        "the database is reachable again; declaring no worker dead for %gs,"
                        " while the others renew their leases",
                        self.settings.lease_s,
                    )
                if drain is None:
                    self._reached_since = sent  # out of reach itself, as the others may be
                    await self._declared_dead()
                    continue
                if drain != self.draining:
                    log.warning("worker %s %s", self.id, "draining" if drain else "claiming again")
                    self.draining = drain
                    self._wake.set()
                self._lease_deadline = sent + self.settings.lease_s
                self._job_ready.set()  # held jobs may start again if the lease had lapsed
                await self._reconcile()
            except DB_ERRORS as exc:
                self._reached_since = None
                log.warning(
                    "heartbeat failed (%s); lease runs out in %.1fs",
                    one_line(exc),
                    self._lease_deadline - loop.time(),
                )

    async def _timeout_watchdog(self) -> None:
        """Cancels handlers past their deadline, checking every TIMEOUT_TICK_S: one loop for
        all jobs instead of a timer armed and disarmed per job on the hot path. A handler still
        running HANDLER_OVERRUN_S past its deadline ignored its cancellation: the worker dies."""
        while True:
            await asyncio.sleep(TIMEOUT_TICK_S)
            now = time.monotonic()
            for job_id, deadline in list(self._deadlines.items()):
                task = self._running.get(job_id)
                if deadline > now or task is None:
                    continue
                if job_id not in self._cancel_reasons:
                    self._cancel_reasons[job_id] = executor.TIMED_OUT
                    task.cancel()
                elif deadline + HANDLER_OVERRUN_S <= now:
                    raise CancellationIgnored(
                        f"job {job_id} runs on {HANDLER_OVERRUN_S:g} s past its timeout, its"
                        " handler ignoring the cancellation: its slot would never come back"
                    )

    async def _held_watch(self) -> None:
        """Gives held jobs back to the queue when every slot has run on for HELD_WAIT_S."""
        while True:
            await asyncio.sleep(HELD_WAIT_S / 4)
            if (
                not self._ready
                or self._stop.is_set()
                or len(self._running) < self.settings.max_concurrent
                or time.monotonic() - self._started_s < HELD_WAIT_S
            ):
                continue
            held = [Release(job.id, None) for job in self._ready]
            self._ready.clear()
            self._job_time_s = max(self._job_time_s, HELD_WAIT_S)  # no more claims ahead
            try:
                await store.release(self._lease_pool, self.id, held)
            except DB_ERRORS as exc:  # still ours in the table: release_lost gives them back
                log.warning("giving back %d held jobs failed (%s)", len(held), one_line(exc))
                continue
            log.info(
                "gave back %d held jobs: every slot has run the same jobs for %g s",
                len(held),
                HELD_WAIT_S,
            )

    async def _thread_watch(self) -> None:
        """Ends the worker (crash-only) once more thread work that its jobs left behind has
        outlived them by THREAD_STUCK_S than the pool has threads beyond a thread per slot: a
        blocking call that never returns (a read from a hung network mount) keeps its thread
        after its job's timeout, and with enough of them every job that needs a thread waited
        for one until its own timeout, failing job after job while the worker looked alive.
        Restarted, the process has a new pool; the jobs go back as for any death."""
        while True:
            await asyncio.sleep(THREAD_WATCH_S)
            stuck = threads.left_behind(self._thread_owner_gone, THREAD_STUCK_S)
            if stuck > threads.THREADS_BEYOND_SLOTS:
                raise ThreadsLeftBehind(
                    f"{stuck} threads are held by work of jobs that ended over"
                    f" {THREAD_STUCK_S:g} s ago (blocking calls that never returned); past"
                    f" {threads.THREADS_BEYOND_SLOTS}, jobs wait for threads that never come"
                    " back"
                )

    def _thread_owner_gone(self, owner: object) -> bool:
        """Whether thread work of `owner` (threads.OWNER) is this worker's, for a job that no
        longer runs here."""
        return isinstance(owner, tuple) and owner[0] == self.id and owner[1] not in self._running

    async def _reconcile(self) -> None:
        """Compares what the database says we run with what we do run. A job we hold but never
        got (the connection died while a claim's answer was on its way) goes back to the queue;
        a job whose cancellation was requested is cancelled."""
        await self._give_back_lost()
        async with self._claim_lock:
            known = self._known()
            cancels = await store.cancel_requests(self._lease_pool, self.id, known)
        for job_id in cancels:  # read from the rows just now
            self._cancel(job_id)

    def _known(self) -> set[UUID]:
        """The jobs this worker runs, holds, or is writing the outcome of."""
        return self._running.keys() | {j.id for j in self._ready} | self._writer.owned_ids()

    async def _give_back_lost(self) -> int:
        """Releases rows running under this worker that it does not know, a batch at a time
        (store.GIVE_BACK_BATCH) with the claim lock let go between batches, for at most half a
        heartbeat interval (the rest at the next look: any writer may set such rows by the
        hundred thousand). Returns how many."""
        loop = asyncio.get_running_loop()
        until = loop.time() + self.settings.heartbeat_interval_s / 2
        given = 0
        while True:
            async with self._claim_lock:
                lost = await store.release_lost(
                    self._lease_pool, self.id, self._known(), store.GIVE_BACK_BATCH
                )
            given += len(lost)
            if len(lost) < store.GIVE_BACK_BATCH or loop.time() >= until:
                break
        if given:
            log.warning("gave back %d jobs claimed for this worker that never reached it", given)
        return given

    async def _declared_dead(self) -> None:
        """Another worker saw our lease expire and rescued our jobs: they may run elsewhere now,
        so ours are abandoned, and we come back as a new worker."""
        log.error(
            "worker %s was declared dead (lease expired); abandoning %d running jobs",
            self.id,
            len(self._running),
        )
        for job_id, task in list(self._running.items()):
            self._cancel_reasons[job_id] = LOST_LEASE
            task.cancel()
        self._ready.clear()
        await self._jobs_done(DRAIN_AT_EXIT_S)
        self._writer.discard()
        self.id = uuid4()
        self._writer.worker_id = self.id
        await self._register()
        self._slot_freed.set()  # the held jobs dropped above freed their slots

    def _on_cancel_notice(self, job_id: UUID) -> None:
        self._cancel_notices.notice(job_id)

    def _runs_here(self, job_id: UUID) -> bool:
        """Whether `job_id` runs here. The jobs claimed ahead are not searched: they are up to
        PREFETCH_MAX, and any role may send notices by the hundred thousand. A cancel of one
        of them is read from the rows by the heartbeat (`_reconcile`)."""
        return job_id in self._running

    async def _cancel_requested(self, job_id: UUID) -> bool:
        return await store.cancel_requested(self._lease_pool, job_id, self.id)

    def _cancel(self, job_id: UUID) -> None:
        """Cancels a job whose row says its cancellation was requested."""
        held = next((j for j in self._ready if j.id == job_id), None)
        if held is not None:  # claimed ahead, never started: just record the cancel
            self._ready.remove(held)
            self._writer.cancelled(job_id)
            self._slot_freed.set()
            return
        task = self._running.get(job_id)
        if task is not None and job_id not in self._cancel_reasons:
            log.info("job %s: cancel requested; cancelling its handler", job_id)
            self._cancel_reasons[job_id] = executor.CANCEL_REQUESTED
            task.cancel()

    async def _drain_unless_dead(self, timeout_s: float) -> bool:
        """The outcome writer's drain, given up at once if a task dies meanwhile."""
        drain = asyncio.ensure_future(self._writer.drain(timeout_s))
        died = asyncio.ensure_future(self._died.wait())
        try:
            await asyncio.wait([drain, died], return_when=asyncio.FIRST_COMPLETED)
        finally:
            died.cancel()
            if not drain.done():
                drain.cancel()
        return drain.done() and not drain.cancelled() and drain.result()

    # -- stopping --------------------------------------------------------------------------

    async def _shutdown(
        self, slots: list[asyncio.Task[None]], loop_tasks: list[asyncio.Task[None]]
    ) -> None:
        self._stop.set()
        self._job_ready.set()  # idle slots see the stop and end
        self._cancel_notices.stop()
        while self._ready:  # claimed ahead, never started: straight back to the queue
            self._writer.released(Release(self._ready.popleft().id, None))
        if not await self._jobs_done(self.settings.grace_s):
            log.warning(
                "grace period over: giving %d unfinished jobs back to the queue", len(self._running)
            )
            for job_id, task in list(self._running.items()):
                self._cancel_reasons.setdefault(job_id, executor.SHUTDOWN)
                task.cancel()
            if not await self._jobs_done(CANCELLED_WITHIN_S):
                # Waited for, they held the stop for ever: a death, whose give-back takes
                # their jobs back (counted) and does not wait for them.
                error = CancellationIgnored(
                    f"{len(self._running)} handler(s) still running {CANCELLED_WITHIN_S:g} s"
                    f" after their cancellation at the stop (jobs {', '.join(map(str, self._running))})"
                )
                self._fatal = WorkerDied("slots", error)
                log.error("%s; giving back their jobs and exiting", self._fatal)
                return
        await asyncio.gather(*slots, return_exceptions=True)
        drained = await self._drain_unless_dead(DRAIN_AT_EXIT_S)
        for task in loop_tasks:
            task.cancel()
        await asyncio.gather(*loop_tasks, return_exceptions=True)
        if self._fatal is not None:
            return  # _die gives back what it can
        if not drained:
            log.error(
                "could not write %d job outcomes before exit; those jobs will be "
                "rescued and run again when the lease expires",
                self._writer.pending(),
            )
            return
        try:
            lost = await store.release_held(self._lease_pool, self.id)
            if lost:
                log.warning(
                    "gave back %d jobs claimed for this worker that never reached it", len(lost)
                )
            await store.unregister_worker(self._lease_pool, self.id)
        except DB_ERRORS as exc:
            log.warning("could not unregister (%s); the lease will expire on its own", exc)


def _version() -> str | None:
    try:
        return metadata.version("sidelinja-worker")
    except metadata.PackageNotFoundError:
        return None
