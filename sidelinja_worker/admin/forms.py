"""Query strings and form fields to typed values, and back (filters and the keyset cursor)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode
from uuid import UUID

from sidelinja_worker.admin.store import STATUS_ORDER, Cursor, JobFilter, Scope

STATUSES = ("error", "retry", "pending", "waiting", "running", "completed", "cancelled")
DEFAULT_STATUS = "error"  # the seed's use: failed jobs first
# A payload search with no start time looks this far back: there is no index on payloads, so
# it reads the rows of the window (see list_jobs in admin.sql).
PAYLOAD_WINDOW = timedelta(days=1)
EARLIEST = datetime.min.replace(tzinfo=UTC)
LATEST = datetime.max.replace(tzinfo=UTC)
# A number is searched for as typed, never through a float (400 digits are inf, which is no
# JSON): jsonb compares numbers of any size exactly. Past this many characters it is text, as
# PostgreSQL's numeric holds at most 16,383 digits after the point.
NUMBER_MAX = 1000


class BadField(ValueError):
    """A field no query can take (the app answers 400 with the message)."""


def text_field(params: Mapping[str, Any], name: str) -> str:
    """A text field as given; BadField if it holds a NUL character, which PostgreSQL's text
    and jsonb cannot (so no job, type or payload has one, and the query would fail)."""
    value = str(params.get(name) or "")
    if "\x00" in value:
        raise BadField(f"{name}: a NUL character is not allowed")
    return value


def parse_job_id(text: str) -> UUID | None:
    try:
        return UUID(text)
    except ValueError:
        return None


# How the From and To fields ask for a time: ISO 8601 in 24-hour time, read as UTC.
TIME_FORMAT = "YYYY-MM-DDTHH:MM:SS"


def _time(text: Any, field: str | None = None) -> datetime | None:
    """A time as ISO 8601 (a space for the T, minutes alone, a date alone, an offset or Z, as
    Python reads it), in UTC; None when there is none. Text that is no time is BadField for a
    form `field` (a filter left out without a word answered for all time, as if its window
    held) and None for a page cursor, which the app writes itself. A time that has no UTC
    datetime (year 1 east of UTC, year 9999 west of it) is, for a form field, the end of time
    it passed, so the window stays a window (left out, it made a bulk retry "To year 1" retry
    every failed job), and None for a cursor."""
    if not text:
        return None
    try:
        value = datetime.fromisoformat(str(text).strip())
    except ValueError:
        if field is None:
            return None
        shown = str(text) if len(str(text)) <= 40 else f"{str(text)[:40]}…"
        raise BadField(
            f"{field}: {shown!r} is no time; type it as {TIME_FORMAT} (24-hour, UTC), or a date"
        ) from None
    try:
        # In UTC: the form shows a time without its zone, and reads such a time back as UTC.
        return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)
    except (ValueError, OverflowError):
        if field is None:
            return None
        return EARLIEST if value.year == 1 else LATEST


def job_filter(params: Mapping[str, Any], scope: Scope) -> JobFilter:
    """The filter a page asked for. A workspace token's own workspace always applies (the
    database enforces it too); an unknown status means all."""
    status = str(params.get("status") or DEFAULT_STATUS)
    workspace = parse_job_id(str(params.get("workspace") or ""))
    payload = payload_filter(text_field(params, "payload"))
    time_from, time_to = _time(params.get("from"), "from"), _time(params.get("to"), "to")
    if payload and time_from is None:
        end = time_to or datetime.now(UTC)
        time_from = max(end, EARLIEST + PAYLOAD_WINDOW) - PAYLOAD_WINDOW  # from year 1 at most
    return JobFilter(
        status=status if status in STATUSES else None,
        job_type=text_field(params, "type") or None,
        workspace_id=scope.workspace_id or workspace,
        time_from=time_from,
        time_to=time_to,
        id_prefix=id_prefix(str(params.get("id") or "")),
        payload=payload,
    )


def id_prefix(text: str) -> str | None:
    """The hex digits of a job id's start ("3fa2", "3fa2c1d0-9b"), or None."""
    digits = text.strip().lower().replace("-", "")
    return digits if re.fullmatch(r"[0-9a-f]{1,32}", digits) else None


def payload_filter(text: str) -> str | None:
    """`episode_id=42, lang=nb` as the JSON object a payload must contain (a number where the
    value is one, else a string), or None when nothing usable is given."""
    fields: dict[str, str] = {}  # each key's value as JSON text
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            continue
        value = value.strip()
        fields[key.strip()] = value if is_number(value) else json.dumps(value)
    if not fields:
        return None
    return "{" + ", ".join(f"{json.dumps(k)}: {v}" for k, v in fields.items()) + "}"


def is_number(value: str) -> bool:
    """In JSON's own number syntax, without an exponent, and at most NUMBER_MAX characters."""
    return (
        len(value) <= NUMBER_MAX
        and re.fullmatch(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?", value) is not None
    )


def page_cursor(params: Mapping[str, Any], f: JobFilter, side: str = "after") -> Cursor | None:
    """The cursor of an "Older" link (`side` "after") or a "Newer" one ("before"); a link
    without its status (older ones) continues the filter's status, or the first of the
    all-statuses list."""
    at = _time(params.get(f"{side}_at"))
    job_id = parse_job_id(str(params.get(f"{side}_id") or ""))
    status = str(params.get(f"{side}_status") or "")
    if status not in STATUSES:
        status = f.status or STATUS_ORDER[0]
    return Cursor(status, at, job_id) if at and job_id else None


def query_string(f: JobFilter, row: Mapping[str, Any] | None, side: str = "after") -> str:
    """The filter as a query string; given a row shown, with a cursor at it: the page after it
    (`side` "after") or before it ("before")."""
    fields = {
        "status": f.status or "all",
        "type": f.job_type or "",
        "workspace": str(f.workspace_id or ""),
        "from": f.time_from.isoformat() if f.time_from else "",
        "to": f.time_to.isoformat() if f.time_to else "",
        "id": f.id_prefix or "",
        "payload": ", ".join(f"{k}={v}" for k, v in payload_fields(f.payload).items())
        if f.payload
        else "",
    }
    if row is not None:
        fields.update(
            {
                f"{side}_status": row["status"],
                f"{side}_at": row["sort_at"].isoformat(),
                f"{side}_id": str(row["id"]),
            }
        )
    return urlencode({k: v for k, v in fields.items() if v})


def payload_fields(payload: str) -> dict[str, str]:
    """A payload filter's fields as typed (numbers as their digits, never parsed)."""
    fields: dict[str, str] = json.loads(payload, parse_int=str, parse_float=str)
    return fields
