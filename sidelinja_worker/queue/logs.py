"""Log format: JSON lines when stderr is not a terminal (collectors parse them), text on a
terminal. A line logged while a job runs carries the job's id, type, workspace and attempt.

What is logged at which level. `info` (the default) has what an operator acts on: start and stop,
every failure, retry, rescue, timeout and deferral with its job's fields, and a summary of the
completions per job type every SUMMARY_INTERVAL_S:

    completed 28412 jobs in the last 10.0 s (noop: 28400, srt_parse: 12)

A successful job has its own line only at `debug`: at tens of thousands of jobs a second, a line
per job costs a third of the worker's throughput and is noise nobody reads.

The summary needs no task of its own: the first completion of a window arms a timer on the
running event loop (`loop.call_later`, one per window, so none while idle), and the timer writes
the window's line. The last window of a run is written by `flush_summary` (the worker's stop
path may call it; an exit handler calls it in any case), so a short burst run still logs its
count.
"""

from __future__ import annotations

import asyncio
import atexit
import contextvars
import logging
import sys
import time
from datetime import UTC, datetime
from typing import Any

from sidelinja_worker.queue import jsonvalues
from sidelinja_worker.queue.escapes import printable, printable_json, printable_lines

# Set once per job in the job's own task (asyncio copies the context per task), so every
# line that task logs is tagged without passing the job around.
# The job itself is stored, not a tuple of its fields: that tuple was built for every job, and
# only a logged line reads them.
_JOB: contextvars.ContextVar[Any] = contextvars.ContextVar("sidelinja_job", default=None)


def bind_job(job: Any) -> None:
    """Hook for the executor: tag this task's log lines with `job` (a ClaimedJob: id,
    job_type, workspace_id, attempt, max_attempts)."""
    _JOB.set(job)


def job_fields() -> dict[str, Any]:
    job = _JOB.get()
    if job is None:
        return {}
    return {
        "job_id": str(job.id),
        "job_type": job.job_type,
        "workspace_id": str(job.workspace_id),
        "attempt": job.attempt,
        "max_attempts": job.max_attempts,
    }


SUMMARY_INTERVAL_S = 10.0

summary_log = logging.getLogger("sidelinja_worker.summary")

# Completions per job type since the window opened; the window opened at _window_start
# (monotonic); _window_loop is the loop whose timer will close it (None: no timer armed).
_completed: dict[str, int] = {}
_window_start = 0.0
_window_loop: asyncio.AbstractEventLoop | None = None


def count_completed(job_type: str) -> None:
    """Hook for the executor: one job of `job_type` completed. While a window is open, a count
    is one dict update (this runs for every job); the first count of a type in a window checks
    the level and arms the timer that logs the window."""
    counts = _completed
    n = counts.get(job_type)
    if n is not None:
        counts[job_type] = n + 1
    else:
        _first_of_type(job_type)


def _first_of_type(job_type: str) -> None:
    global _window_start, _window_loop
    if not summary_log.isEnabledFor(logging.INFO):
        return
    if not _completed:
        _window_start = time.monotonic()
    _completed[job_type] = 1
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # outside a loop: the next flush writes the count
        return
    if _window_loop is not loop:  # no timer yet, or armed on a loop that has since closed
        _window_loop = loop
        # A fresh context: the timer must not inherit the completing job's log fields.
        loop.call_later(SUMMARY_INTERVAL_S, _on_timer, loop, context=contextvars.Context())


def _on_timer(loop: asyncio.AbstractEventLoop) -> None:
    global _window_loop
    if _window_loop is loop:
        _window_loop = None
        flush_summary()


def flush_summary() -> None:
    """Logs the completions counted since the window opened, if any, and closes the window."""
    if not _completed:
        return
    counts = dict(sorted(_completed.items(), key=lambda kv: (-kv[1], kv[0])))
    _completed.clear()
    elapsed_s = time.monotonic() - _window_start
    total = sum(counts.values())
    summary_log.info(
        "completed %d jobs in the last %.1f s (%s)",
        total,
        elapsed_s,
        ", ".join(f"{name}: {n}" for name, n in counts.items()),
        extra={"summary": {"completed": total, "window_s": round(elapsed_s, 3), "by_type": counts}},
    )


atexit.register(flush_summary)


# A text line: the time, the level, the message (cli.main sets it up this way).
TEXT_FORMAT = "%(asctime)s %(levelname)s %(message)s"
TEXT_DATE_FORMAT = "%H:%M:%S"


class TextFormatter(logging.Formatter):
    """One line a record, the message's control and bidi characters as escapes: a failure's
    message quotes a payload or a service's answer, whose escape sequences would act on the
    operator's terminal and whose line breaks would start lines that read like ours. A
    traceback keeps its line breaks."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT, TEXT_DATE_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:
        return printable(super().formatMessage(record))

    def formatException(self, ei: Any) -> str:
        return printable_lines(super().formatException(ei))


# A message or traceback longer than this is cut, saying so: a handler's exception may carry
# megabytes (an answer quoted whole), and each failed attempt wrote all of it to the log.
TEXT_MAX = 16_000


def _bounded(text: str) -> str:
    if len(text) <= TEXT_MAX:
        return text
    return f"{text[:TEXT_MAX]}… [{len(text) - TEXT_MAX:,} more characters cut]"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": _bounded(record.getMessage()),
            **job_fields(),
        }
        summary = getattr(record, "summary", None)
        if summary is not None:  # collectors read the counts without parsing the message
            line.update(summary)
        if record.exc_info:
            line["exc"] = _bounded(self.formatException(record.exc_info))
        try:
            encoded = jsonvalues.dumps_lenient(line)
        except TypeError:
            # A lone surrogate (an undecodable file name in an OSError, a service's answer)
            # is no UTF-8, and orjson refuses it: the record was lost, and logging's own
            # complaint went out as dozens of lines that are not JSON.
            encoded = jsonvalues.dumps_lenient(_without_surrogates(line))
        # orjson escapes C0 controls; C1 and bidi characters act on a terminal too.
        return printable_json(encoded.decode())


def _without_surrogates(value: Any) -> Any:
    """`value` with each lone surrogate in its texts (keys too) as "?"."""
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, dict):
        return {_without_surrogates(str(k)): _without_surrogates(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_without_surrogates(v) for v in value]
    return _without_surrogates(str(value)) if not isinstance(value, int | float | bool) else value


def want_json(stream: Any = None, forced: str | None = None) -> bool:
    """`forced` ("json" or "text", the settings' log format) wins; otherwise JSON unless on a
    terminal."""
    if forced in ("json", "text"):
        return forced == "json"
    stream = stream or sys.stderr
    return not (hasattr(stream, "isatty") and stream.isatty())


def setup(forced: str | None = None) -> None:
    """Replaces the root handler's formatter; call after logging.basicConfig."""
    formatter = JsonFormatter() if want_json(forced=forced) else TextFormatter()
    for handler in logging.getLogger().handlers:
        handler.setFormatter(formatter)
