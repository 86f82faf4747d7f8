"""The dashboard's figures and charts: per-minute aggregates (job_minute_stats) folded into
series and percentiles, and the charts drawn as inline SVG on the server (no script, no CDN)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import asyncpg
from markupsafe import Markup, escape

from sidelinja_worker.admin import store
from sidelinja_worker.admin.store import Scope
from sidelinja_worker.queue import store as worker_store
from sidelinja_worker.queue.metrics import ALL_WORKSPACES, MINUTE_BOUNDS_S

HOUR = 60
DAY = 1440
# Waiting job types the dashboard names, those with the most waiting jobs; the rest are one row
# (worker_store.OTHER_TYPES). Each row holds a day of per-minute figures and a chart.
TYPES_MAX = 100


@dataclass
class Figures:
    """One job type's (or the whole queue's) numbers."""

    name: str
    completed: list[int] = field(default_factory=lambda: [0] * DAY)  # per minute, oldest first
    failed: list[int] = field(default_factory=lambda: [0] * DAY)
    buckets: list[int] = field(default_factory=lambda: [0] * (len(MINUTE_BOUNDS_S) + 1))
    waiting: int = 0
    due: int = 0

    @property
    def completed_hour(self) -> int:
        return sum(self.completed[-HOUR:])

    @property
    def failed_hour(self) -> int:
        return sum(self.failed[-HOUR:])

    def percentile_s(self, q: float) -> float | None:
        """The upper bound of the run-time bucket holding the q-quantile (last hour)."""
        total = sum(self.buckets)
        if not total:
            return None
        seen = 0
        for i, n in enumerate(self.buckets):
            seen += n
            if seen >= q * total:
                return MINUTE_BOUNDS_S[i] if i < len(MINUTE_BOUNDS_S) else float("inf")
        return None


@dataclass
class Dashboard:
    now: datetime
    total: Figures
    types: list[Figures]
    oldest_due_s: float | None  # None: no job is due


async def load(
    conn: asyncpg.Connection,
    scope: Scope,
    now: datetime,
    timeout_s: float = worker_store.STATEMENT_TIMEOUT_S,
) -> Dashboard:
    """`conn` is scoped (row-level security): a workspace token reads its workspace's rows,
    a platform admin the whole queue's. timeout_s is asyncpg's for the engine's statement."""
    workspace = scope.workspace_id or ALL_WORKSPACES
    start = now.replace(second=0, microsecond=0) - timedelta(minutes=DAY - 1)
    total, types = Figures("all types"), {}
    for r in await store.dashboard_series(conn, workspace, start):
        figs = types[r["job_type"]] = Figures(r["job_type"])
        for i, done, failed in zip(r["at"], r["completed"], r["failed"], strict=True):
            if 0 <= i < DAY:
                figs.completed[i] += done
                figs.failed[i] += failed
                total.completed[i] += done
                total.failed[i] += failed
    hour_ago = start + timedelta(minutes=DAY - HOUR)
    for r in await store.dashboard_buckets(conn, workspace, hour_ago):
        figs = types.setdefault(r["job_type"], Figures(r["job_type"]))
        figs.buckets = list(r["buckets"])
        total.buckets = [a + b for a, b in zip(total.buckets, r["buckets"], strict=False)]
    for d in await store.dashboard_depth(conn, TYPES_MAX):
        name = d["job_type"] if d["job_type"] is not None else worker_store.OTHER_TYPES
        figs = types.setdefault(name, Figures(name))
        figs.waiting, figs.due = d["waiting"], d["due"]
        total.waiting += d["waiting"]
        total.due += d["due"]
    oldest = await worker_store.oldest_due_s(conn, timeout_s)
    return Dashboard(now, total, [types[k] for k in sorted(types)], oldest)


def chart(completed: Sequence[int], failed: Sequence[int], label: str) -> Markup:
    """Completed (green) and failed (red) per minute as an inline SVG line chart."""
    width, height, pad = 480, 110, 4
    top = max(1, *completed, *failed)
    step = (width - 2 * pad) / max(len(completed) - 1, 1)

    def points(values: Iterable[int]) -> str:
        return " ".join(
            f"{pad + i * step:.1f},{height - pad - v / top * (height - 2 * pad):.1f}"
            for i, v in enumerate(values)
        )

    return Markup(
        f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{escape(label)}" data-max="{top}">'
        f"<title>{escape(label)}; peak {top} per minute</title>"
        f'<polyline class="c-completed" points="{points(completed)}"/>'
        f'<polyline class="c-failed" points="{points(failed)}"/>'
        f'<text x="{width - pad}" y="12" text-anchor="end">{top}/min</text></svg>'
    )
