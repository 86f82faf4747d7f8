"""JSON encoding of values a handler hands over: results, follow-up payloads, log fields.

orjson writes datetimes itself and calls their `tzinfo.utcoffset()` without checking what comes
back: a tzinfo whose `utcoffset()` raises kills the process (a segfault, so no log line and no
outcome for any job the worker holds), and one that returns no timedelta is written as a
nonsense offset ("+474710:15"). A handler's tzinfo is anyone's code, so datetimes, dates and
times go through Python's own `isoformat()`, which checks, and a broken one fails its own job
as a result that is not JSON. Plain values keep orjson's speed: only those three types take the
detour.
"""

from __future__ import annotations

from datetime import date, datetime, time
from typing import Any

import orjson

_OPTION = orjson.OPT_PASSTHROUGH_DATETIME


def _as_json(value: Any) -> Any:
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    raise TypeError(f"Type is not JSON serializable: {type(value).__name__}")


def dumps(value: Any) -> bytes:
    """orjson's bytes for `value`; a TypeError (orjson's JSONEncodeError) for what is no JSON,
    a broken datetime included."""
    return orjson.dumps(value, default=_as_json, option=_OPTION)


def _as_text(value: Any) -> Any:
    try:
        return value.isoformat() if isinstance(value, datetime | date | time) else str(value)
    except Exception as exc:  # a log line must not be lost for one field
        return f"<unprintable {type(value).__name__}: {type(exc).__name__}>"


def dumps_lenient(value: Any) -> bytes:
    """As `dumps`, but a value that is no JSON is written as its text (log fields): every
    line is written."""
    return orjson.dumps(value, default=_as_text, option=_OPTION)
