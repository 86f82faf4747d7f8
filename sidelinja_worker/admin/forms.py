"""Query strings and form fields to typed values, and back (filters and the keyset cursor)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode
from uuid import UUID

from sidelinja_worker.admin.store import STATUS_ORDER, Cursor, JobFilter, Scope

STATUSES = ("error", "retry", "pending", "running", "completed", "cancelled")
DEFAULT_STATUS = "error"  # the seed's use: failed jobs first


def parse_job_id(text: str) -> UUID | None:
    try:
        return UUID(text)
    except ValueError:
        return None


def _time(text: Any) -> datetime | None:
    if not text:
        return None
    try:
        value = datetime.fromisoformat(str(text))
    except ValueError:
        return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def job_filter(params: Mapping[str, Any], scope: Scope) -> JobFilter:
    """The filter a page asked for. A workspace token's own workspace always applies (the
    database enforces it too); an unknown status means all."""
    status = str(params.get("status") or DEFAULT_STATUS)
    workspace = parse_job_id(str(params.get("workspace") or ""))
    return JobFilter(
        status=status if status in STATUSES else None,
        job_type=str(params.get("type") or "") or None,
        workspace_id=scope.workspace_id or workspace,
        time_from=_time(params.get("from")),
        time_to=_time(params.get("to")),
    )


def page_cursor(params: Mapping[str, Any], f: JobFilter) -> Cursor | None:
    """The cursor of a next-page link; a link without its status (older ones) continues the
    filter's status, or the first of the all-statuses list."""
    at, job_id = _time(params.get("after_at")), parse_job_id(str(params.get("after_id") or ""))
    status = str(params.get("after_status") or "")
    if status not in STATUSES:
        status = f.status or STATUS_ORDER[0]
    return Cursor(status, at, job_id) if at and job_id else None


def query_string(f: JobFilter, last: Mapping[str, Any] | None) -> str:
    """The filter (and, given the last row shown, the next page's cursor) as a query string."""
    fields = {
        "status": f.status or "all",
        "type": f.job_type or "",
        "workspace": str(f.workspace_id or ""),
        "from": f.time_from.isoformat() if f.time_from else "",
        "to": f.time_to.isoformat() if f.time_to else "",
    }
    if last is not None:
        fields.update(
            after_status=last["status"],
            after_at=last["sort_at"].isoformat(),
            after_id=str(last["id"]),
        )
    return urlencode({k: v for k, v in fields.items() if v})
