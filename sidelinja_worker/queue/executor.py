"""One job from start to finish: find its type, validate the payload, run the handler under its
timeout, and hand exactly one outcome to the outcome writer."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine, Mapping
from contextvars import ContextVar
from typing import Any
from uuid import UUID

from sidelinja_worker.queue import jsonvalues, logs, metrics, store, tracing
from sidelinja_worker.queue.backoff import clamp_s, defer_until, retry_delay_s
from sidelinja_worker.queue.context import JobContext, Services, clean_text
from sidelinja_worker.queue.db import RawJson
from sidelinja_worker.queue.errors import Defer, PermanentError, RetryJob
from sidelinja_worker.queue.jobs import ClaimedJob
from sidelinja_worker.queue.outcomes import OutcomeWriter
from sidelinja_worker.queue.registry import JobType
from sidelinja_worker.queue.store import Failure, Release

log = logging.getLogger("sidelinja_worker.job")

# Why the worker cancelled a running handler; read by the executor to record the right outcome.
CANCEL_REQUESTED = "cancel-requested"
SHUTDOWN = "shutdown"
TIMED_OUT = "timed-out"


# A result bigger than this (encoded JSON) is refused: the job ends in `error` saying so. Big
# enough for any transcript or analysis, small enough that a runaway result cannot take the
# worker's memory or a batch write down with it.
MAX_RESULT_BYTES = 16 * 1024 * 1024
# A payload the claim left behind (over 8 kB stored, or compressed) is read alone when its job
# runs, and refused over this many bytes of JSON: any plain-SQL insert can write a payload of
# hundreds of megabytes, and a slot must not parse that. Big input belongs in a file or a
# table the payload names.
MAX_PAYLOAD_BYTES = 4 * 1024 * 1024
# Arrays and objects a payload may hold (counted as its text's `[` and `{`, those in strings
# too): decoding makes a Python object of each on the event loop, and 4 MB of `[]` (1.4 million)
# held the loop 0.8-5 s. 100,000 decode in ~50 ms.
MAX_PAYLOAD_CONTAINERS = 100_000
# An error message is cut to this many characters before it is stored.
MAX_MESSAGE_CHARS = 4000


def timeout_for(job: ClaimedJob, jt: JobType | None, max_timeout_s: float) -> float:
    """The job's own timeout (`timeout_s`), else its type's, never above the worker's cap. A
    row's value is the web app's: one that is not a positive number is ignored."""
    own = clamp_s(job.timeout_s, max_timeout_s)
    if own:
        return own
    return timeout_for_type(jt, max_timeout_s)


def timeout_for_type(jt: JobType | None, max_timeout_s: float) -> float:
    """The timeout of a job of type `jt` that sets none of its own."""
    return min(float(jt.timeout_s), max_timeout_s) if jt is not None else max_timeout_s


# True while `execute` runs an attempt inside its span (set by `_in_span`), so the inner
# call runs the attempt itself. Read only with tracing on.
_IN_SPAN: ContextVar[bool] = ContextVar("sidelinja_in_job_span", default=False)

# What an attempt ended in, for its span: the outcome ("completed", "retry", "error",
# "deferred", "cancelled", "timeout", "released") and the exception behind a failure.
Attempt = tuple[str, BaseException | None]


async def execute(
    job: ClaimedJob,
    jt: JobType | None,
    writer: OutcomeWriter,
    services: Services,
    worker_id: UUID,
    timeout_s: float,
    cancel_reasons: Mapping[UUID, str],
) -> Attempt:
    """Runs `job` to one recorded outcome. The worker enforces `timeout_s` by cancelling the
    task with the reason TIMED_OUT in `cancel_reasons` (one watchdog for all jobs is far
    cheaper than a timer per job); the reason decides what a cancellation means. With tracing
    on, this runs again inside the attempt's span (`_in_span`); off, tracing costs a job one
    module attribute read, and no extra coroutine or parameter."""
    if tracing.ENABLED and not _IN_SPAN.get():
        attempt = execute(job, jt, writer, services, worker_id, timeout_s, cancel_reasons)
        return await _in_span(job, worker_id, attempt)
    logs.bind_job(job)  # every line this task logs carries the job's id, type, workspace
    if jt is None:  # only when a worker was started with a type it then lost; be explicit
        message = f"no handler for job type {job.job_type!r}"
        return _fail(writer, job, "unknown_type", message, permanent=True), LookupError(message)
    ctx = JobContext(
        job.id, job.workspace_id, job.job_type, job.attempt, job.max_attempts, services, worker_id
    )
    try:
        missing = jt.needs_settings and services.config.missing(jt.needs_settings)
        if missing:
            raise PermanentError(
                f"{', '.join(missing)} not set: configure it (env var or flag) "
                f"to run {job.job_type} jobs"
            )
        raw = job.payload
        if raw is None:  # too big for the claim to carry (see claims in queries.sql)
            raw = await _left_behind_payload(services, job.id)
        payload = jt.parse_payload(raw)
        started_s = time.perf_counter()
        result = await jt.handler(ctx, payload)
        writer.completed(job.id, _encode_result(result), ctx.follow_ups)
        metrics.completed(job.job_type, time.perf_counter() - started_s)
        logs.count_completed(job.job_type)  # the periodic summary at info
        if log.isEnabledFor(logging.DEBUG):  # a line per success only at debug
            log.debug(
                "job %s %s completed (attempt %d/%d)",
                job.id,
                job.job_type,
                job.attempt,
                job.max_attempts,
            )
        return "completed", None
    except RawResultError as exc:
        return _fail(writer, job, "bad_result", text_of(exc), permanent=True), exc
    except TimeoutError as exc:  # the handler's own (an HTTP read, say); ours is a cancellation
        return _fail(writer, job, "transient", "TimeoutError: a call timed out"), exc
    except RetryJob as exc:
        return _fail(writer, job, "transient", text_of(exc), after_s=exc.after_s), exc
    except PermanentError as exc:
        return _fail(writer, job, "permanent", text_of(exc), permanent=True), exc
    except Defer as exc:
        until = defer_until(exc.after_s, exc.until)
        why = clean_message(text_of(exc))
        log.info("job %s deferred until %s: %s", job.id, until.isoformat(), why)
        writer.released(Release(job.id, until, why))
        return "deferred", None
    except asyncio.CancelledError as exc:
        task = asyncio.current_task()
        assert task is not None
        reason: str | None = cancel_reasons.get(job.id)
        if task.cancelling():
            task.uncancel()
        if reason is None:
            # Not a cancellation of the worker's (each sets its reason first): the handler
            # raised CancelledError, awaited a task someone cancelled, or its own timer
            # cancelled this task. Taken for a stop, it put the job back with its attempt
            # returned, to run again at once, for ever: a failure of the handler's.
            message = "CancelledError: the handler's own cancellation escaped it"
            return _fail(writer, job, "transient", message), exc
        if reason == TIMED_OUT:
            message = f"timed out after {timeout_s:g} s"
            _fail(writer, job, "timeout", message)
            return "timeout", TimeoutError(message)
        if reason == CANCEL_REQUESTED:
            writer.cancelled(job.id)
            return "cancelled", None
        # shutdown past the grace period: back to the queue, not a failed attempt
        writer.released(Release(job.id, None))
        return "released", None
    # A handler bug or an unclassified fault: transient, retried. SystemExit and
    # KeyboardInterrupt too: raised by a handler (or a library's command-line entry point it
    # calls), they went out of the event loop and stopped the worker, with SystemExit(0) at
    # exit code 0, which a process manager takes for a clean stop. The worker's own stop
    # signals never raise them: they are handled on the loop (cli.commands).
    # Any other BaseException a handler raises (GeneratorExit, a class of its own) is its
    # failure too: let through, it ended the slot and with it the worker.
    except BaseException as exc:
        log.warning(
            "job %s (%s) raised %s", job.id, job.job_type, type(exc).__name__, exc_info=True
        )
        return _fail(writer, job, "transient", f"{type(exc).__name__}: {text_of(exc)}"), exc


def text_of(exc: BaseException) -> str:
    """str(exc), whatever the handler's exception does: a __str__ that raises, or returns no
    str, ended the slot that ran it, and the worker with it."""
    try:
        text = str(exc)
    except Exception:
        return f"<{type(exc).__name__} whose message could not be read>"
    return text if isinstance(text, str) else f"<{type(exc).__name__}>"


async def _in_span(
    job: ClaimedJob, worker_id: UUID, attempt: Coroutine[Any, Any, Attempt]
) -> Attempt:
    """Runs `attempt` (this job's `execute`) with the attempt's span current in this task,
    and ends the span with the outcome (tracing.end_job_span)."""
    inside = _IN_SPAN.set(True)
    try:
        try:
            span, token = tracing.start_job_span(job, worker_id)
        except Exception:  # tracing never costs a job its run: it runs untraced
            log.warning("job %s: no span (tracing failed)", job.id, exc_info=True)
            return await attempt
        ended: Attempt = ("abandoned", None)  # if something past the handler's failures escapes
        try:
            ended = await attempt
            return ended
        finally:
            outcome, error = ended
            message = clean_message(f"{type(error).__name__}: {text_of(error)}") if error else None
            try:
                tracing.end_job_span(span, token, outcome, error, message)
            except Exception:  # the outcome is recorded; a slot must not die for its span
                log.warning("job %s: span not ended (tracing failed)", job.id, exc_info=True)
    finally:
        _IN_SPAN.reset(inside)


async def _left_behind_payload(services: Services, job_id: UUID) -> Any:
    found = await store.job_payload(
        services.pool, job_id, MAX_PAYLOAD_BYTES, MAX_PAYLOAD_CONTAINERS
    )
    if found is None:
        raise LookupError(f"job {job_id} is gone")
    size, containers, payload = found
    if payload is None and size > MAX_PAYLOAD_BYTES:  # else JSON null, for the type to refuse
        raise PermanentError(
            f"payload of {size:,} bytes of JSON, over the cap of {MAX_PAYLOAD_BYTES:,}: store"
            " big input elsewhere and pass a reference"
        )
    if payload is None and containers > MAX_PAYLOAD_CONTAINERS:
        raise PermanentError(
            f"payload of up to {containers:,} arrays and objects, over the cap of"
            f" {MAX_PAYLOAD_CONTAINERS:,}: store big input elsewhere and pass a reference"
        )
    return payload


class RawResultError(Exception):
    pass


def _encode_result(result: object) -> RawJson:
    try:
        raw = jsonvalues.dumps(result)
    except TypeError as exc:
        raise RawResultError(f"handler returned a result that is not JSON: {exc}") from None
    if len(raw) > MAX_RESULT_BYTES:
        raise RawResultError(
            f"handler returned a result of {len(raw):,} bytes of JSON, over the cap of "
            f"{MAX_RESULT_BYTES:,}: store big output elsewhere and return a reference"
        )
    return RawJson(raw)


def clean_message(message: str) -> str:
    """A message fit for a text column (see `clean_text`): an outside service's answer may hold
    NUL bytes, and a refused failure must not keep the job from its outcome."""
    return clean_text(message, MAX_MESSAGE_CHARS)


def _fail(
    writer: OutcomeWriter,
    job: ClaimedJob,
    kind: str,
    message: str,
    *,
    permanent: bool = False,
    after_s: float | None = None,
) -> str:
    """Records the failure; returns the outcome: "error" when the job ends here, else
    "retry"."""
    metrics.failed(job.job_type)
    delay_s = retry_delay_s(after_s, job.attempt)
    message = clean_message(message) if message else kind
    writer.failed(Failure(job.id, kind, message, permanent, delay_s))
    if permanent or job.attempt >= job.max_attempts:
        log.warning(
            "job %s %s failed for good (attempt %d/%d, %s): %s",
            job.id,
            job.job_type,
            job.attempt,
            job.max_attempts,
            kind,
            message,
        )
        return "error"
    log.warning(
        "job %s %s failed (attempt %d/%d, %s), retry in %gs: %s",
        job.id,
        job.job_type,
        job.attempt,
        job.max_attempts,
        kind,
        delay_s,
        message,
    )
    return "retry"
