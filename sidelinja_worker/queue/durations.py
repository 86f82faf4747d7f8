"""Durations, one rule for every flag, env var and limit: a number with a unit, `500ms`, `1s`,
`2m`, `1h`, `14d`, or several parts, `1h30m`. A bare number other than 0 is refused: `10` could
be seconds or minutes, and a wrong guess schedules a job an hour off. Units take any case but an
uppercase M, which is refused for the same reason: `1M` reads as a month as often as a minute."""

from __future__ import annotations

import re

from sidelinja_worker.queue.errors import UserError

_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
HINT = "use a number with ms, s, m, h or d, e.g. 500ms, 1s, 2m, 1h, 14d"


def parse_duration_s(text: str) -> float:
    """Seconds in `text`. Raises UserError naming the bad value."""
    if re.search(r"M(?![sS])", text):
        raise UserError(
            f"bad duration {text!r}: M could be minutes or months; "
            "use m for minutes or d for days (30d for a month)"
        )
    cleaned = text.strip().lower()
    if cleaned.startswith("-"):
        raise UserError(f"bad duration {text!r}: must not be negative")
    if re.fullmatch(r"0+(\.0+)?", cleaned):
        return 0.0
    parts = _PART.findall(cleaned)
    if not parts or "".join(n + u for n, u in parts) != cleaned:
        if re.fullmatch(r"\d+(\.\d+)?", cleaned):
            raise UserError(
                f"bad duration {text!r}: a unit is needed, e.g. {cleaned}s or {cleaned}m"
            )
        raise UserError(f"bad duration {text!r}: {HINT}")
    return sum(float(n) * _UNIT_S[u] for n, u in parts)
