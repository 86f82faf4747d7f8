"""sidelinja-worker: Sidelinja's PostgreSQL job queue and the worker that runs it."""

from sidelinja_worker.client import NewJob, enqueue, enqueue_many
from sidelinja_worker.errors import Defer, PermanentError, RetryJob

__all__ = ["Defer", "NewJob", "PermanentError", "RetryJob", "enqueue", "enqueue_many"]
