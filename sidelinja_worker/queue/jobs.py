"""Job values: the status enum and the claimed job a handler runs. Imports nothing of ours."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any
from uuid import UUID


class JobStatus(enum.StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    ERROR = "error"
    RETRY = "retry"
    CANCELLED = "cancelled"
    WAITING = "waiting"  # in a graph, for unfinished parents (job_dependencies)


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
