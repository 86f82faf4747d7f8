"""What a handler gets: its job's identity and the process's shared resources, typed."""

from __future__ import annotations

import asyncio
import functools
import logging
import ssl
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast
from uuid import UUID

import asyncpg
import httpx

from sidelinja_worker.queue import store, tracing
from sidelinja_worker.queue.backoff import clamp_s
from sidelinja_worker.queue.client import NewJob
from sidelinja_worker.queue.config import ServiceConfig
from sidelinja_worker.queue.db import DB_ERRORS
from sidelinja_worker.queue.errors import PermanentError
from sidelinja_worker.queue.ids import uuid7s
from sidelinja_worker.queue.limits import RateLimiter

log = logging.getLogger("sidelinja_worker.job")

MAX_PROGRESS_CHARS = 500  # a progress message is a line for a live page, not a log
# The most jobs one job may add (follow-ups, children and joins together). They are inserted,
# with their edges, in the transaction that completes the job, beside other jobs' outcomes: a
# fan-out sized by hostile input (a payload's list, a file's length) must fail that one job,
# not hold a worker's outcome writer in one giant transaction. A bigger graph is built in
# layers: a job per layer that adds up to this many.
MAX_FOLLOW_UPS = 10_000
# The most bytes of JSON a job's parents' results may hold together for `parent_results`: a
# join's parents may be thousands, each result up to the executor's cap, and any plain-SQL
# writer can make one bigger. Over it, the asking job fails permanently, naming the sum.
MAX_PARENT_RESULTS_BYTES = 64 * 1024 * 1024
# The most bytes of JSON a workspace's settings may hold: prompts, name lists and limits fit in
# a few kilobytes, and every job of most types reads them, decoded on the event loop (1 MB:
# about 5 ms here). Over it, the job fails permanently, naming the size.
MAX_SETTINGS_BYTES = 1024 * 1024
_JSON_KINDS = {list: "an array", str: "a string", bool: "true or false", int: "a number"}


def clean_text(text: object, max_chars: int) -> str:
    """`text` fit for a text or jsonb column: a string without NUL bytes or lone surrogates
    (PostgreSQL refuses both), cut to `max_chars`."""
    value = text if isinstance(text, str) else str(text)
    if len(value) > max_chars:
        value = value[: max_chars - 1] + "…"
    if "\x00" in value:
        value = value.replace("\x00", "\\0")
    if not value.isascii():
        value = value.encode("utf-8", "replace").decode("utf-8")
    return value


class Services:
    """Process-wide resources shared by every handler. Outbound HTTP goes through the one
    `http` client; each service client sets its own timeouts per request. The worker builds
    the client in a thread as it starts (`prepare_http`): built on the event loop, httpx's
    first client took 40-70 ms (its transport's import and the CA bundle of its TLS context),
    every running job's loop held that long."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        http: httpx.AsyncClient | None,
        config: ServiceConfig,
        limiter: RateLimiter,
    ) -> None:
        self.pool = pool
        self.config = config
        self.limiter = limiter
        self._http = http

    @property
    def http(self) -> httpx.AsyncClient:
        if self._http is None:  # asked for before `prepare_http` finished: built here
            self._http = _new_http_client()
        elif self._http.is_closed:
            # A handler closed the shared client (`async with ctx.services.http:`): every
            # later call of every job failed with "the client has been closed".
            log.warning("the shared HTTP client was closed by a handler; a new one is made")
            self._http = _new_http_client()
        return self._http

    async def prepare_http(self) -> None:
        """Builds the HTTP client in a thread, unless one is there already."""
        if self._http is not None:
            return
        client = await asyncio.to_thread(_new_http_client)
        if self._http is None:
            self._http = client
        else:  # built on the loop meanwhile; this one never opened a connection
            await client.aclose()

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()


def _new_http_client() -> httpx.AsyncClient:
    client = httpx.AsyncClient(timeout=httpx.Timeout(60.0, connect=10.0), verify=_tls_context())
    if tracing.ENABLED:  # each call a child span of the job's, carrying its traceparent
        tracing.instrument_http(client)
    return client


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """httpx's default verification (certifi's bundle, or SSL_CERT_FILE / SSL_CERT_DIR), loaded
    once per process: loading the bundle is most of a client's cost."""
    return httpx.create_ssl_context()


def _traced(job: NewJob) -> NewJob:
    """`job` carrying the current span's context (this job's span, with tracing on): the outcome
    writer enqueues it later, outside this job's task and its context."""
    if tracing.ENABLED and job.traceparent is None:
        current = tracing.current_traceparent()
        if current is not None:
            return replace(job, traceparent=current)
    return job


def _is_workspace(value: UUID | str, workspace_id: UUID) -> bool:
    """Whether `value` (a NewJob's workspace: a UUID or its text) names `workspace_id`."""
    if isinstance(value, UUID):
        return value == workspace_id
    try:
        return UUID(str(value)) == workspace_id
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class ParentResult:
    job_id: UUID
    job_type: str
    status: str
    result: Any


@dataclass
class JobContext:
    job_id: UUID
    workspace_id: UUID
    job_type: str
    attempt: int
    max_attempts: int
    services: Services
    worker_id: UUID
    # Jobs to enqueue in the same transaction that marks this job completed (and only then).
    follow_ups: list[NewJob] = field(default_factory=list)
    # Made on the first report: most jobs never report, and a context is made per job.
    _progress_lock: asyncio.Lock | None = field(default=None, repr=False, compare=False)
    # Read on the first ask: a job that never asks (most) costs no query.
    _parents: list[ParentResult] | None = field(default=None, repr=False, compare=False)

    def enqueue_on_success(self, job: NewJob) -> None:
        """`job` is enqueued atomically with this job's completion: if this job fails, is
        retried or its outcome is lost, it is not enqueued (no duplicates on re-runs)."""
        self._check_room(job)
        self.follow_ups.append(_traced(job).checked())

    def _check_room(self, job: NewJob) -> None:
        """A PermanentError unless this job may add `job`: at most MAX_FOLLOW_UPS jobs, all in
        its own workspace. The worker that commits them may write every workspace, so a name
        a handler took from its input must not carry a job into another one."""
        if len(self.follow_ups) >= MAX_FOLLOW_UPS:
            raise PermanentError(
                f"job {self.job_id} adds more than {MAX_FOLLOW_UPS:,} jobs; build a bigger"
                " graph in layers"
            )
        if not _is_workspace(job.workspace_id, self.workspace_id):
            raise PermanentError(
                f"job {self.job_id} may add jobs to its own workspace only, not to"
                f" {str(job.workspace_id)[:100]!r}"
            )

    def add_child(self, job: NewJob, *, after: Sequence[UUID] = ()) -> UUID:
        """Fan-out: `job` becomes a child of this job, enqueued with its completion (as
        `enqueue_on_success`), and also waits for the jobs in `after` (other children added
        here, for a join). Returns the child's id, fixed now so that a join can name it.
        A job adds at most MAX_FOLLOW_UPS jobs, in its own workspace; one more, or one
        elsewhere, is a PermanentError."""
        self._check_room(job)
        child = replace(
            _traced(job),
            job_id=job.job_id or uuid7s(1)[0],
            parents=(self.job_id, *job.parents, *after),
        )
        self.follow_ups.append(child.checked())
        return cast(UUID, child.job_id)

    def add_join(self, job: NewJob, children: Sequence[UUID]) -> UUID:
        """Fan-in: `job` runs once every one of `children` (ids from `add_child`) completed."""
        return self.add_child(job, after=children)

    async def parent_results(self) -> list[ParentResult]:
        """This job's parents in a graph (oldest first), each with its status and result.
        Their results together are at most MAX_PARENT_RESULTS_BYTES of JSON, and they are at
        most MAX_FOLLOW_UPS (what a handler's join may add); more is a PermanentError, and no
        more than that is ever read."""
        if self._parents is None:
            cap = MAX_PARENT_RESULTS_BYTES
            rows = await store.parent_results(
                self.services.pool, self.job_id, cap, MAX_FOLLOW_UPS + 1
            )
            if rows and rows[0]["parents"] > MAX_FOLLOW_UPS:
                raise PermanentError(
                    f"this job has {rows[0]['parents']:,} parents, over the"
                    f" {MAX_FOLLOW_UPS:,} a handler reads"
                )
            if rows and rows[0]["total"] > cap:
                raise PermanentError(
                    f"the results of this job's {len(rows)} parents are {rows[0]['total']:,}"
                    f" bytes of JSON together, over the cap of {cap:,}"
                )
            self._parents = [
                ParentResult(r["id"], r["job_type"], r["status"], r["result"]) for r in rows
            ]
        return self._parents

    async def children(self) -> list[tuple[UUID, str, str]]:
        """This job's children already in the table: (id, job_type, status), at most
        store.MAX_RELATIVES of them, unfinished ones first (any writer may add more)."""
        rows = await store.job_relatives(self.services.pool, self.job_id)
        return [(r["id"], r["job_type"], r["status"]) for r in rows if r["relation"] == "child"]

    async def has_child(self, job_type: str) -> bool:
        """Whether this job has a child of `job_type` in the table, however many it has."""
        return await store.has_child(self.services.pool, self.job_id, job_type)

    async def parent_result(self, job_type: str) -> Any:
        """The result of this job's parent of type `job_type` (the last one if several);
        LookupError if it has none."""
        found = [p for p in await self.parent_results() if p.job_type == job_type]
        if not found:
            raise LookupError(f"job {self.job_id} has no {job_type} parent")
        return found[-1].result

    async def workspace_settings(self) -> dict[str, Any]:
        """`workspaces.settings` of this job's workspace (prompts, name lists, limits): a JSON
        object of at most MAX_SETTINGS_BYTES, else a PermanentError saying what is wrong."""
        size, settings = await store.workspace_settings(
            self.services.pool, self.workspace_id, MAX_SETTINGS_BYTES
        )
        if size > MAX_SETTINGS_BYTES:
            raise PermanentError(
                f"the workspace's settings are {size:,} bytes of JSON, over the cap of"
                f" {MAX_SETTINGS_BYTES:,}: keep big lists elsewhere"
            )
        if settings is None:
            return {}
        if not isinstance(settings, dict):
            kind = _JSON_KINDS.get(type(settings), "a number")
            raise PermanentError(f"the workspace's settings are {kind} in JSON, not an object")
        return settings

    async def progress(self, message: str, percent: float | None = None) -> None:
        """Reports progress ("Transkriberer…", 40 %): stored on the job and published on the
        `sidelinja_job_events` channel. A lost report never fails the job.

        One job's reports are written one at a time, in the order they were made: concurrent
        parts of a job (prompt_eval's cases) each report, and on separate pool connections a
        later report could commit first and leave an older one stored (seen: "5/6" left
        after "6/6")."""
        # A service's numbers and words go into jsonb and a NOTIFY: a finite percent in
        # [0, 100] (else none) and a short message without NUL bytes.
        percent = clamp_s(percent, 100.0)
        message = clean_text(message, MAX_PROGRESS_CHARS)
        if self._progress_lock is None:
            self._progress_lock = asyncio.Lock()
        async with self._progress_lock:  # FIFO: waiters acquire in the order they came
            try:
                await store.report_progress(
                    self.services.pool, self.job_id, self.worker_id, message, percent
                )
            except DB_ERRORS as exc:
                log.warning("job %s: progress not recorded (%s)", self.job_id, exc)
