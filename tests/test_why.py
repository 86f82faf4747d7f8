"""`jobs why`'s reasons from a job's facts (queue/why.py), without a database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from sidelinja_worker.queue.why import explain

DUE: dict[str, Any] = {
    "status": "pending",
    "job_type": "noop",
    "workspace_id": "w",
    "progress": None,
    "not_due": False,
    "scheduled_for": None,
    "live_workers": 1,
    "type_running": [],
    "type_cap": None,
    "workspace_cap": None,
    "workspace_running": 0,
    "paused_services": None,
    "ahead": 0,
}


@pytest.mark.parametrize(
    ("status", "ending"),
    [
        ("error", "`sidelinja-worker jobs retry ID` runs it again"),
        ("completed", "it will not run again"),
        ("cancelled", "it will not run again"),
    ],
)
def test_a_finished_job_says_whether_a_retry_runs_it_again(status: str, ending: str) -> None:
    # Every finished job read "it will not run again unless retried", where `jobs retry`
    # takes failed jobs only.
    assert explain({**DUE, "status": status, "error_msg": None}) == [f"it is {status}; {ending}"]


def test_times_written_in_json_read_as_row_times_do() -> None:
    # A pause's, a service pause's and a deferral's times were shown as their JSON text
    # (2026-01-02T04:04:05.123456+01:00), where a row's read 2026-01-02 03:04:05 UTC.
    at = "2026-01-02T04:04:05.123456+01:00"
    facts = {
        **DUE,
        "not_due": True,
        "scheduled_for": datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        "progress": {"deferred_until": at, "message": "busy"},
        "type_paused": {"by": "alice", "at": at, "reason": "upgrade"},
        "paused_services": {"ai_gateway": at},
    }
    lines = explain(facts)
    assert lines[0] == "deferred until 2026-01-02 03:04:05 UTC: busy"
    assert "(by alice at 2026-01-02 03:04:05 UTC: upgrade)" in lines[1]
    assert "not due until 2026-01-02 03:04:05 UTC" in lines
    assert "service ai_gateway is rate-limited (paused) until 2026-01-02 03:04:05 UTC" in lines


@pytest.mark.parametrize(
    ("written", "shown"),
    [
        ("tomorrow", "tomorrow"),  # any writer may put any text where a time belongs
        (datetime.max.replace(tzinfo=timezone(timedelta(hours=-1))), "9999-12-31 23:59:59 UTC"),
        (None, "an unknown time"),
    ],
)
def test_a_time_no_datetime_holds_is_shown_as_it_is(written: Any, shown: str) -> None:
    facts = {**DUE, "not_due": True, "progress": {"deferred_until": written, "message": "m"}}
    assert explain(facts)[0] == f"deferred until {shown}: m"


def test_one_is_not_plural() -> None:
    facts = {**DUE, "ahead": 1, "workspace_cap": 1, "workspace_running": 1}
    lines = explain(facts)
    assert "workspace w already runs 1 job, its cap is 1" in lines
    assert "waiting behind 1 due job of higher priority or older in the same priority" in lines
