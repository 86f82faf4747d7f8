"""`/metrics` of the admin app: the queue as the token's scope sees it, read at scrape time."""

from __future__ import annotations

import asyncpg
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Gauge,
    generate_latest,
)

from sidelinja_worker.admin import store
from sidelinja_worker.queue import store as worker_store

CONTENT_TYPE = CONTENT_TYPE_LATEST


async def render(
    conn: asyncpg.Connection, timeout_s: float = worker_store.STATEMENT_TIMEOUT_S
) -> bytes:
    """A registry per scrape: the values depend on who asks (RLS), so nothing is shared.
    timeout_s is asyncpg's for the engine's statements."""
    registry = CollectorRegistry()
    jobs = Gauge(
        "sidelinja_jobs",
        "Jobs in the queue by status and type",
        ["status", "job_type"],
        registry=registry,
    )
    for row in await worker_store.counts(conn, timeout_s):
        jobs.labels(row["status"], row["job_type"] or worker_store.OTHER_TYPES).set(row["n"])
    Gauge(
        "sidelinja_oldest_due_job_age_seconds",
        "Age of the oldest job that is due and waiting",
        registry=registry,
    ).set(await worker_store.oldest_due_s(conn, timeout_s) or 0.0)
    finished = Gauge(
        "sidelinja_jobs_finished_last_hour",
        "Jobs finished in the last hour",
        ["status"],
        registry=registry,
    )
    for row in await store.throughput(conn):
        finished.labels(row["status"]).inc(row["n"])
    return generate_latest(registry)
