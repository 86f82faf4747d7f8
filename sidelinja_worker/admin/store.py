"""One typed async function per named query in sql/admin.sql. Job queries take a connection
from `scoped()`, which runs as sidelinja_app under row-level security."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any
from uuid import UUID

import asyncpg

from sidelinja_worker.queue.queries import load

Q = load("sidelinja_worker.admin", "sql/admin.sql")
PAGE_SIZE = 50
# The all-statuses list shows one status after another: what needs an operator first, the bulk
# (completed) last. Waiting jobs (a graph's children held by their parents) come after the
# pending ones they will become. Within a status, newest first; completed jobs by when they finished.
STATUS_ORDER = ("error", "retry", "running", "pending", "waiting", "cancelled", "completed")


@dataclass(frozen=True, slots=True)
class Scope:
    """Who is asking: a token and its workspace (None: every workspace, a platform admin)."""

    token_id: UUID | None
    workspace_id: UUID | None

    def allows(self, workspace_id: UUID | str) -> bool:
        return self.workspace_id is None or str(self.workspace_id) == str(workspace_id)


@dataclass(frozen=True, slots=True)
class JobFilter:
    """What the list shows. status None: every status. The time window is on the time each
    status's list is sorted by: created_at, or completed_at for completed jobs."""

    status: str | None = None
    job_type: str | None = None
    workspace_id: UUID | None = None
    time_from: datetime | None = None
    time_to: datetime | None = None
    id_prefix: str | None = None  # hex digits a job id starts with
    payload: str | None = None  # JSON object the payload must contain

    def args(self) -> tuple[Any, ...]:
        return (self.status, self.job_type, self.workspace_id, self.time_from, self.time_to)

    def search_args(self) -> tuple[Any, ...]:
        """The id prefix as the range of ids it covers, and the payload as JSON text, which the
        query casts to jsonb: the jsonb codec (orjson) cannot encode a number past 64 bits,
        and jsonb holds numbers of any size."""
        if not self.id_prefix:
            return (None, None, self.payload)
        low, high = (UUID(self.id_prefix.ljust(32, c)) for c in "0f")
        return (low, high, self.payload)


@dataclass(frozen=True, slots=True)
class Cursor:
    """The last row of the page before: its status and its (sort_at, id) within that status."""

    status: str
    sort_at: datetime
    id: UUID


@asynccontextmanager
async def scoped(
    pool: asyncpg.Pool, scope: Scope, statement_timeout_s: float | None = None
) -> AsyncIterator[asyncpg.Connection]:
    """A transaction as sidelinja_app, seeing only the scope's workspace (RLS); a platform
    admin's as sidelinja_platform_admin. With statement_timeout_s, its statements give up after
    that long instead of the pool's bound (an action's longer one)."""
    async with pool.acquire() as conn, conn.transaction():
        if statement_timeout_s is not None:
            await conn.execute(Q["statement_timeout"], str(round(statement_timeout_s * 1000)))
        await conn.execute(Q["scope"], str(scope.workspace_id or ""))
        await conn.execute(Q["enter_app_role" if scope.workspace_id else "enter_platform_role"])
        yield conn


async def create_token(
    conn: asyncpg.Connection | asyncpg.Pool,
    digest: bytes,
    workspace_id: UUID | None,
    label: str | None,
) -> UUID:
    return await conn.fetchval(Q["token_create"], digest, workspace_id, label)


async def lookup_token(conn: asyncpg.Pool, digest: bytes) -> Scope | None:
    row = await conn.fetchrow(Q["token_lookup"], digest)
    return Scope(row[0], row[1]) if row else None


async def revoke_token(conn: asyncpg.Pool, token_id: UUID) -> bool:
    return await conn.fetchval(Q["token_revoke"], token_id) is not None


async def token_labels(
    conn: asyncpg.Pool, token_ids: list[UUID], timeout_s: float | None = None
) -> dict[UUID, str]:
    """The label of each named token that has one and still has its row."""
    rows = await conn.fetch(Q["token_labels"], token_ids, timeout=timeout_s)
    return {r["id"]: r["label"] for r in rows}


async def create_session(
    conn: asyncpg.Pool, digest: bytes, token_id: UUID | None, lifetime_s: float
) -> None:
    """A session for the token, ending lifetime_s from now; expired ones are dropped first."""
    async with conn.acquire() as c, c.transaction():
        await c.execute(Q["session_prune"])
        await c.execute(Q["session_create"], digest, token_id, lifetime_s)


async def lookup_session(conn: asyncpg.Pool, digest: bytes) -> Scope | None:
    row = await conn.fetchrow(Q["session_lookup"], digest)
    return Scope(row[0], row[1]) if row else None


async def delete_session(conn: asyncpg.Pool, digest: bytes) -> None:
    await conn.execute(Q["session_delete"], digest)


async def list_tokens(conn: asyncpg.Pool) -> list[asyncpg.Record]:
    return await conn.fetch(Q["token_list"])


async def list_jobs(
    conn: asyncpg.Connection,
    f: JobFilter,
    after: Cursor | None,
    limit: int = PAGE_SIZE,
    newer: bool = False,
) -> list[asyncpg.Record]:
    """A page of jobs after the cursor. Every status is its own keyset query over its own
    index; all statuses are read one after another in STATUS_ORDER until the page is full, so
    a page costs one or two index scans, never a sort of the whole table. With `newer`, the
    `limit` jobs just before the cursor instead (it needs one), read nearest first through the
    same indexes and statuses the other way, and returned in the list's order."""
    if f.status:
        statuses: tuple[str, ...] = (f.status,)
    elif newer:
        assert after is not None
        statuses = STATUS_ORDER[: STATUS_ORDER.index(after.status) + 1][::-1]
    else:
        statuses = STATUS_ORDER[STATUS_ORDER.index(after.status) if after else 0 :]
    rows: list[asyncpg.Record] = []
    for status in statuses:
        at, job_id = (after.sort_at, after.id) if after and after.status == status else (None, None)
        query = "list_completed" if status == "completed" else "list_jobs"
        rows += await conn.fetch(
            Q[f"{query}_newer" if newer else query],
            *replace(f, status=status).args(),
            at,
            job_id,
            limit - len(rows),
            *f.search_args(),
        )
        if len(rows) >= limit:
            break
    return rows[::-1] if newer else rows


# The most bytes (as stored, perhaps compressed) of a payload, result or error history the job
# page shows; a bigger one is named with its size (`sidelinja-worker jobs show` prints it).
SHOW_MAX_BYTES = 128 * 1024
# The characters of a job type or unique key the admin reads (admin.sql cuts them to this).
TEXT_SHOWN = 512


def short_id(job_id: UUID | str) -> str:
    """A job id as the pages' short links name it: its start, which "Id starts with" searches
    for, and its end. The ids the worker makes are UUIDv7, whose first 12 digits are the
    millisecond they were made in: a graph enqueued at once, or a worker's jobs claimed
    together, shared their first 8 and even 12 digits, and their links read the same. The last
    6 digits are random in every UUID version."""
    text = str(job_id)
    return f"{text[:8]}…{text[-6:]}"


async def get_job(conn: asyncpg.Connection, job_id: UUID) -> asyncpg.Record | None:
    return await conn.fetchrow(Q["get_job"], job_id, SHOW_MAX_BYTES)


async def jobs_for_events(conn: asyncpg.Connection, ids: list[UUID]) -> list[asyncpg.Record]:
    return await conn.fetch(Q["jobs_for_events"], ids)


# A job in `error` holds no unique key (docs/sql-contract.md), so another job may have taken
# it; putting the job back, or a graph child its retry brings back, would then break the key.
KEY_HELD = (
    "not retried: the job's unique key, or that of a job its retry would bring back, is held"
    " by another queued job; cancel or finish that one first"
)


async def retry_job(conn: asyncpg.Connection, job_id: UUID, timeout_s: float | None = None) -> bool:
    return await conn.fetchval(Q["retry_job"], job_id, timeout=timeout_s) is not None


async def retry_node(
    conn: asyncpg.Connection, job_id: UUID, timeout_s: float | None = None
) -> UUID | None:
    """Retry as a graph understands it: a failed job is put back (retry_job); a job cancelled by
    a parent's failure puts back the failed ancestor that cancelled its branch, which brings the
    branch back; a job cancelled by hand is put back and waits again for any unfinished parent.
    The id of the job put back, or None if there was nothing to retry. timeout_s: asyncpg's for
    each statement (None: the connection's default), as a branch brought back may be large."""
    root = await conn.fetchrow(Q["retry_root"], job_id, timeout=timeout_s)
    if root is None:
        return None
    if root["status"] in ("error", "retry"):
        return root["id"] if await retry_job(conn, root["id"], timeout_s) else None
    if root["status"] == "cancelled" and root["cancelled_by"] is None:
        back = await conn.fetchval(Q["retry_cancelled"], root["id"], timeout=timeout_s)
        if back is not None:
            await conn.execute(Q["settle"], [back], timeout=timeout_s)
        return back
    return None


async def graph_nodes(conn: asyncpg.Connection, job_id: UUID, limit: int) -> list[asyncpg.Record]:
    return await conn.fetch(Q["graph_nodes"], job_id, limit)


async def graph_edges(
    conn: asyncpg.Connection, ids: list[UUID], limit: int
) -> list[asyncpg.Record]:
    return await conn.fetch(Q["graph_edges"], ids, limit)


async def bulk_retry(
    conn: asyncpg.Connection, f: JobFilter, limit: int, timeout_s: float | None = None
) -> list[UUID]:
    rows = await conn.fetch(Q["bulk_retry"], *f.args(), limit, *f.search_args(), timeout=timeout_s)
    return [r[0] for r in rows]


async def audit(
    conn: asyncpg.Connection, scope: Scope, action: str, job_ids: list[UUID], detail: dict[str, Any]
) -> None:
    """Recorded in the action's own transaction, as the privileged role (the app role cannot
    write the audit table, so a web app bug cannot forge entries)."""
    await conn.execute(Q["leave_app_role"])
    await conn.execute(Q["audit"], scope.token_id, scope.workspace_id, action, job_ids, detail)
    await conn.execute(Q["enter_app_role" if scope.workspace_id else "enter_platform_role"])


async def audit_queue(
    pool: asyncpg.Pool, scope: Scope, action: str, detail: dict[str, Any]
) -> None:
    """A queue-wide action (a drain): a platform admin's, written with the privileged pool."""
    await pool.execute(Q["audit"], scope.token_id, None, action, [], detail)


async def throughput(conn: asyncpg.Connection) -> list[asyncpg.Record]:
    return await conn.fetch(Q["throughput"])


async def type_counts(conn: asyncpg.Connection, job_types: list[str]) -> list[asyncpg.Record]:
    return await conn.fetch(Q["type_counts"], job_types)


async def job_type_queued(
    conn: asyncpg.Pool, job_type: str, timeout_s: float | None = None
) -> bool:
    return bool(await conn.fetchval(Q["job_type_queued"], job_type, timeout=timeout_s))


async def workspace_names(
    conn: asyncpg.Pool, workspace_ids: list[UUID], timeout_s: float | None = None
) -> dict[UUID, str]:
    rows = await conn.fetch(Q["workspace_names"], workspace_ids, timeout=timeout_s)
    return {r["id"]: r["name"] for r in rows}


async def workspaces(conn: asyncpg.Pool) -> list[asyncpg.Record]:
    return await conn.fetch(Q["workspaces"])


async def dashboard_series(
    conn: asyncpg.Connection, workspace_id: UUID, since: datetime
) -> list[asyncpg.Record]:
    return await conn.fetch(Q["dashboard_series"], workspace_id, since)


async def dashboard_buckets(
    conn: asyncpg.Connection, workspace_id: UUID, since: datetime
) -> list[asyncpg.Record]:
    return await conn.fetch(Q["dashboard_buckets"], workspace_id, since)


async def dashboard_depth(conn: asyncpg.Connection, max_types: int) -> list[asyncpg.Record]:
    """Waiting and due jobs of the max_types types with the most waiting, and of the rest
    together under a job_type of None."""
    return await conn.fetch(Q["dashboard_depth"], max_types)
