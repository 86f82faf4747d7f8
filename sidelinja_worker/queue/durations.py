"""Parse the durations of flags and env vars: `500ms`, `1s`, `2m`, `1h`, `1.5s`, `1h30m`."""

from __future__ import annotations

import re

from sidelinja_worker.queue.errors import UserError

_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")


def parse_duration_s(text: str) -> float:
    """Seconds in `text`. A bare number is seconds. Raises UserError naming the bad value."""
    cleaned = text.strip().lower()
    try:
        return _non_negative(float(cleaned), text)
    except ValueError:
        pass
    parts = _PART.findall(cleaned)
    if not parts or "".join(n + u for n, u in parts) != cleaned:
        raise UserError(
            f"bad duration {text!r}: use a number with ms, s, m, h or d, e.g. 500ms, 1s, 2m, 1h"
        )
    return _non_negative(sum(float(n) * _UNIT_S[u] for n, u in parts), text)


def _non_negative(seconds: float, text: str) -> float:
    if seconds < 0:
        raise UserError(f"bad duration {text!r}: must not be negative")
    return seconds
