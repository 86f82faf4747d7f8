"""One typed async function per named query in sql/stats.sql: the database side of stats_parse."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterable, Sequence
from dataclasses import dataclass
from datetime import date
from uuid import UUID

import asyncpg

from sidelinja_worker.queue.db import Conn
from sidelinja_worker.queue.queries import load

Q = load("sidelinja_worker.jobs.stats")

# A listener's ranges are summed within a UTC day; a day's rows stay this long for lines that
# Caddy writes late (a download is logged when it ends) and then go with the day's salt.
KEEP_LISTENER_DAYS = 3
# Rotated files live 90 days by default (roll_keep_for); forget a log text a bit after that.
KEEP_FILE_STATE_DAYS = 120


@dataclass(frozen=True, slots=True)
class FileState:
    read_offset: int
    complete: bool


@dataclass(frozen=True, slots=True)
class FileSave:
    fingerprint: str
    name: str
    read_offset: int
    complete: bool


@dataclass(frozen=True, slots=True)
class ListenRow:
    day: date
    episode: str
    listener: bytes
    app: str
    country: str
    bytes: int
    whole: bool


@dataclass(frozen=True, slots=True)
class DailyRow:
    day: date
    episode: str
    app: str
    country: str
    downloads: int


async def file_states(
    conn: Conn, workspace_id: UUID, fingerprints: Sequence[str]
) -> dict[str, FileState]:
    rows = await conn.fetch(Q["file_states"], workspace_id, list(fingerprints))
    return {r[0]: FileState(r[1], r[2]) for r in rows}


async def salts(conn: Conn, workspace_id: UUID, days: Sequence[date]) -> dict[date, bytes]:
    """Each day's salt, made (random, 32 bytes) for the days that have none yet."""
    days = sorted(set(days))
    await conn.execute(Q["add_salts"], workspace_id, days, [secrets.token_bytes(32) for _ in days])
    rows = await conn.fetch(Q["salts"], workspace_id, days)
    return {r[0]: bytes(r[1]) for r in rows}


async def commit_run(
    conn: asyncpg.Connection,
    workspace_id: UUID,
    started: dict[str, int],
    files: Sequence[FileSave],
    listens: AsyncIterable[Sequence[ListenRow]],
    days: Sequence[date],
    thresholds: dict[str, int | None],
    today: date,
) -> int | None:
    """Adds the run's listens (batches, read as they come), counts the listeners that reached their threshold and records
    the offsets, in one transaction. None (nothing written) when another run committed offsets
    for these files since `started` was read: the caller re-reads from the new offsets."""
    async with conn.transaction():
        await conn.execute(Q["lock_workspace"], workspace_id)
        now = await file_states(conn, workspace_id, list(started))
        if any((now[f].read_offset if f in now else 0) != off for f, off in started.items()):
            return None
        async for batch in listens:
            await _add_listens(conn, workspace_id, batch)
        added = await conn.fetchval(
            Q["count_downloads"],
            workspace_id,
            list(thresholds),
            list(thresholds.values()),
            sorted(days),
        )
        await conn.execute(
            Q["save_files"],
            workspace_id,
            [f.fingerprint for f in files],
            [f.name for f in files],
            [f.read_offset for f in files],
            [f.complete for f in files],
        )
        await conn.execute(
            Q["prune"],
            workspace_id,
            date.fromordinal(today.toordinal() - KEEP_LISTENER_DAYS),
            KEEP_FILE_STATE_DAYS,
        )
        return int(added)


async def _add_listens(
    conn: asyncpg.Connection, workspace_id: UUID, rows: Sequence[ListenRow]
) -> None:
    await conn.execute(
        Q["add_listens"],
        workspace_id,
        [r.day for r in rows],
        [r.episode for r in rows],
        [r.listener for r in rows],
        [r.app for r in rows],
        [r.country for r in rows],
        [r.bytes for r in rows],
        [r.whole for r in rows],
    )


async def daily_downloads(conn: Conn, workspace_id: UUID) -> list[DailyRow]:
    rows = await conn.fetch(Q["daily_downloads"], workspace_id)
    return [DailyRow(*r) for r in rows]
