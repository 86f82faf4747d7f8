"""Log format: JSON lines when stderr is not a terminal (collectors parse them), text on a
terminal. A line logged while a job runs carries the job's id, type, workspace and attempt."""

from __future__ import annotations

import contextvars
import logging
import sys
from datetime import UTC, datetime
from typing import Any

import orjson

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


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **job_fields(),
        }
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()


def want_json(stream: Any = None, forced: str | None = None) -> bool:
    """`forced` ("json" or "text", the settings' log format) wins; otherwise JSON unless on a
    terminal."""
    if forced in ("json", "text"):
        return forced == "json"
    stream = stream or sys.stderr
    return not (hasattr(stream, "isatty") and stream.isatty())


def setup(forced: str | None = None) -> None:
    """Replaces the root handler's formatter; call after logging.basicConfig."""
    if not want_json(forced=forced):
        return
    for handler in logging.getLogger().handlers:
        handler.setFormatter(JsonFormatter())
