"""The closed set of outcomes a handler can raise, and the error a command reports in one line."""

from __future__ import annotations

from datetime import datetime

from sidelinja_worker.queue.backoff import DEFER_MAX_S, RETRY_MAX_S, clamp_s


class RetryJob(Exception):
    """A transient failure: retry with the seed's backoff, or after `after_s` when the service
    said how long to wait (Retry-After). The last attempt still ends in `error`."""

    def __init__(self, message: str, *, after_s: float | None = None) -> None:
        super().__init__(message)
        # Clamped here too, so a value from outside (a header) is a number fit for a timer
        # wherever it is read; NaN or garbage means "use the backoff".
        self.after_s = clamp_s(after_s, RETRY_MAX_S)


class PermanentError(Exception):
    """Bad input that will not get better: invalid payload, missing file, a 4xx. No retries."""


class Defer(Exception):
    """Not now, and not a failure: the job goes back to the queue, its attempt not counted.
    Give `after_s` or `until` (an aware datetime)."""

    def __init__(
        self, reason: str, *, after_s: float | None = None, until: datetime | None = None
    ) -> None:
        if (after_s is None) == (until is None):
            raise ValueError("Defer needs exactly one of after_s or until")
        super().__init__(reason)
        self.after_s = None if after_s is None else clamp_s(after_s, DEFER_MAX_S, 0.0)
        self.until = until


class UserError(Exception):
    """A problem the user can fix; the CLI prints its message as one line and exits non-zero."""
