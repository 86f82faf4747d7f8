"""`jobs why ID`: turns the facts about a job into the reasons it is not running (yet)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any


def explain(facts: Mapping[str, Any], missing_settings: Sequence[str] = ()) -> list[str]:
    """Reasons, most decisive first. Pure: the facts come from store.why_facts (and a job's
    `parents`, id, job_type and status, from store.job_relatives), and `missing_settings` are
    the settings its job type needs that this machine has not set."""
    status = facts["status"]
    if status == "running":
        return [f"it is running (since {_at(facts['started_at'])}, worker {facts['worker_id']})"]
    if status == "waiting":
        waiting = [
            f"waiting for parent {p['id']} ({p['job_type']}, {p['status']})"
            for p in facts.get("parents") or ()
            if p["status"] not in ("completed", "error", "cancelled")
        ]
        return waiting or ["it is waiting for its parents; none is unfinished any more"]
    if status not in ("pending", "retry"):
        ended = f": {facts['error_msg']}" if facts["error_msg"] else ""
        # Only a failed job is retried by `jobs retry`; a completed or cancelled one ends here.
        again = (
            "`sidelinja-worker jobs retry ID` runs it again"
            if status == "error"
            else ("it will not run again")
        )
        return [f"it is {status}{ended}; {again}"]
    reasons = _deferral(facts)
    if missing_settings:
        reasons.append(
            f"{facts['job_type']} needs {', '.join(missing_settings)}, not set here: a worker "
            "without them fails the job at once (check the workers' environment)"
        )
    if paused := facts.get("type_paused"):
        reasons.append(
            f"job type {facts['job_type']} is paused cluster-wide (by {paused['by']} at "
            f"{_at(paused['at'])}: {paused['reason'] or 'no reason given'}); "
            f"`sidelinja-worker resume {facts['job_type']}` lets workers take it again"
        )
    if facts["not_due"]:
        reasons.append(f"not due until {_at(facts['scheduled_for'])}")
    if facts["live_workers"] == 0:
        reasons.append(
            f"no live worker handles {facts['job_type']} jobs "
            f"(start one with `sidelinja-worker run --types {facts['job_type']}`)"
        )
    reasons += _caps(facts)
    for service, until in (facts["paused_services"] or {}).items():
        reasons.append(f"service {service} is rate-limited (paused) until {_at(until)}")
    if facts["ahead"]:
        reasons.append(
            f"waiting behind {_count(facts['ahead'], 'due job')} of higher priority or "
            f"older in the same priority"
        )
    return reasons or ["nothing holds it back: a worker should take it at its next claim"]


def _at(when: object) -> str:
    """A time as a line shows it, in UTC to the second: a row's timestamp, or one written in
    JSON (a pause's, a deferral's, as ISO 8601 text). Any writer may leave a running row
    without its start, or write any text where a time belongs: that text is shown as it is."""
    if isinstance(when, str):
        try:
            return _at(datetime.fromisoformat(when))
        except ValueError:
            return when
    if isinstance(when, datetime):
        if when.tzinfo is None:
            return f"{when:%Y-%m-%d %H:%M:%S}"
        try:
            when = when.astimezone(UTC)
        except OverflowError:  # 'infinity' comes back as the last datetime, in its own zone
            pass
        return f"{when:%Y-%m-%d %H:%M:%S} UTC"
    return "an unknown time"


def _count(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _deferral(facts: Mapping[str, Any]) -> list[str]:
    # progress is jsonb the web app may write as anything: only an object can name a deferral.
    progress = facts["progress"] if isinstance(facts["progress"], dict) else {}
    if facts["not_due"] and "deferred_until" in progress:
        return [f"deferred until {_at(progress['deferred_until'])}: {progress.get('message')}"]
    return []


def _caps(facts: Mapping[str, Any]) -> list[str]:
    reasons = []
    running = list(facts["type_running"] or [])
    if facts["type_cap"] is not None and len(running) >= facts["type_cap"]:
        held = ", ".join(str(i) for i in running[:5]) + (" …" if len(running) > 5 else "")
        reasons.append(
            f"the cluster limit for {facts['job_type']} ({facts['type_cap']} at "
            f"once) is full, held by jobs {held}"
        )
    cap = facts["workspace_cap"]
    if cap is not None and facts["workspace_running"] >= cap:
        reasons.append(
            f"workspace {facts['workspace_id']} already runs "
            f"{_count(facts['workspace_running'], 'job')}, its cap is {cap}"
        )
    return reasons
