"""The seed's retry backoff, 30 s × 2^(attempts−1): 30 s, 60 s, 120 s…, and the clamps every
delay from outside (a handler's `after_s`, a service's Retry-After, a rate limit's wait) goes
through before it reaches SQL or a timer."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from sidelinja_worker.queue import clock

BASE_S = 30.0
MAX_S = 6 * 3600.0  # so a job with max_attempts=30 does not wait for years
# A retry is never scheduled further out than this, whatever a service or a handler asks for.
RETRY_MAX_S = MAX_S
# A deferral (not a failure: the governor, a rate limit) waits at most this long.
DEFER_MAX_S = 7 * 86400.0


def backoff_s(attempt: int) -> float:
    """Delay before the retry that follows failed attempt number `attempt` (1-based)."""
    return min(BASE_S * 2.0 ** min(max(attempt - 1, 0), 30), MAX_S)


def clamp_s(value: object, cap_s: float, default: float | None = None) -> float | None:
    """`value` as seconds in [0, cap_s]; `default` when it is not a finite number (None, NaN,
    ±inf, a string, a bool): an absurd delay never reaches `make_interval` or `asyncio.sleep`."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return default
    try:
        seconds = float(value)
    except OverflowError:  # an int too big for a float
        return cap_s if value > 0 else 0.0
    if math.isnan(seconds):
        return default
    return min(max(seconds, 0.0), cap_s)


def retry_delay_s(after_s: object, attempt: int) -> float:
    """The delay before a retry: the asked one, clamped to RETRY_MAX_S, else the backoff."""
    delay = clamp_s(after_s, RETRY_MAX_S)
    return backoff_s(attempt) if delay is None else delay


def defer_until(after_s: object, until: object, now: datetime | None = None) -> datetime:
    """When a deferred job is due again: `until` (an aware datetime) or now + `after_s`, never
    past now + DEFER_MAX_S; anything unreadable means "now". "Now" is the database's
    (clock.py): the due time is compared with its `now()`, not this machine's."""
    now = now or clock.now()
    latest = now + timedelta(seconds=DEFER_MAX_S)
    if isinstance(until, datetime):
        aware = until if until.tzinfo is not None else until.replace(tzinfo=UTC)
        return min(aware, latest)
    return now + timedelta(seconds=clamp_s(after_s, DEFER_MAX_S, 0.0) or 0.0)
