"""sidelinja-worker: Sidelinja's PostgreSQL job queue and the worker that runs it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sidelinja_worker.queue.errors import Defer, PermanentError, RetryJob

if TYPE_CHECKING:
    from sidelinja_worker.queue.client import NewJob, enqueue, enqueue_many

__all__ = ["Defer", "NewJob", "PermanentError", "RetryJob", "enqueue", "enqueue_many"]

_CLIENT = {"NewJob", "enqueue", "enqueue_many"}


def __getattr__(name: str) -> Any:
    """The client's names, imported on first use: a process that needs none of them (the
    stats_parse child parses logs) does not pay for asyncpg and the store (~0.17 s a start)."""
    if name in _CLIENT:
        from sidelinja_worker.queue import client

        return getattr(client, name)
    raise AttributeError(f"module 'sidelinja_worker' has no attribute {name!r}")
