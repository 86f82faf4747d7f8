"""The database's clock, as this process last read it.

Every time of the queue is the database's: `created_at`, `scheduled_for`, the leases, the
claims' "due" test all come from its `now()`. The few times a worker computes in Python and
writes (a deferral's due time, the next run of a recurring job, the dashboard's minute, the
day a run of the download statistics counts up to) must be on that clock too. On this
machine's own clock, a worker whose clock is off by an hour (a VM resumed from a snapshot, a
container host without time sync) deferred jobs into the database's past, where they were
claimed and deferred again at once, for an hour; or, a clock ahead, an hour longer than
asked; and put its minutes where the dashboard never looked.

The worker reads the database's `now()` at registration and with every heartbeat
(`observe`), and `now()` here is this machine's clock moved by the offset last measured. The
offset is taken at the middle of the statement's round trip, so it is off by at most half of
it; a reading whose round trip took longer than MAX_ROUND_TRIP_S is not taken, unless there is
none yet. A process that never reads it (a CLI command, a test calling a handler) uses its
own clock."""

from __future__ import annotations

import time as _time
from datetime import UTC, datetime

MAX_ROUND_TRIP_S = 1.0

_offset_s = 0.0
_measured = False


def observe(db_now: datetime, sent_s: float, received_s: float) -> None:
    """Takes a reading of the database's clock: `db_now`, its `now()` in a statement sent at
    `sent_s` and answered at `received_s` (both `time.time()` of this machine)."""
    global _offset_s, _measured
    round_trip_s = received_s - sent_s
    if _measured and not 0 <= round_trip_s <= MAX_ROUND_TRIP_S:
        return
    _offset_s = db_now.timestamp() - (sent_s + received_s) / 2
    _measured = True


def offset_s() -> float:
    """The database's clock minus this machine's, in seconds (0 until measured)."""
    return _offset_s


def time() -> float:
    """The database's time as seconds since the epoch, as `time.time()` gives this machine's."""
    return _time.time() + _offset_s


def now() -> datetime:
    """The database's time, aware, in UTC."""
    return datetime.fromtimestamp(time(), UTC)


def reset() -> None:
    """Forgets the readings (tests)."""
    global _offset_s, _measured
    _offset_s = 0.0
    _measured = False
