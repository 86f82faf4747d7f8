"""The claimed job a handler runs, as a value. Imports nothing of ours."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from uuid import UUID


@dataclass(slots=True)
class ClaimedJob:
    """A row as the claim statement returns it; `attempt` is the one now running (1-based).
    Read-only by convention: not frozen, because a frozen dataclass's __init__ cost 2.5 µs a
    job against 0.25 µs (it sets every field through object.__setattr__)."""

    id: UUID
    workspace_id: UUID
    job_type: str
    payload: Any
    priority: int
    attempt: int
    max_attempts: int
    timeout_s: int | None
    waited_s: float = 0.0  # from due to claimed: the pickup latency
    traceparent: str | None = None  # the enqueuer's W3C trace context, as the row holds it
