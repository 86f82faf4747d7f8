"""The worker's settings as one frozen value; the CLI fills it from flags and env vars."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WorkerSettings:
    max_concurrent: int = 3
    poll_interval_s: float = 1.0
    job_types: tuple[str, ...] = ()  # empty: every registered type
    burst: bool = False
    lease_s: float = 60.0
    grace_s: float = 30.0
    listen: bool = True
    max_timeout_s: float = 6 * 3600.0  # the cap on any job's timeout override
    keep_completed_s: float = 14 * 86400.0  # retention of completed and cancelled jobs
    keep_errors_s: float = 90 * 86400.0  # retention of jobs that ended in error
    prune_interval_s: float = 60.0

    @property
    def heartbeat_interval_s(self) -> float:
        # Three renewals per lease: one lost heartbeat never lets a live worker's lease lapse.
        return self.lease_s / 3
