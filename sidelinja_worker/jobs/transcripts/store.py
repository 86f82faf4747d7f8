"""One typed async function per named query in sql/transcripts.sql: the transcript tables."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import asyncpg

from sidelinja_worker.jobs.transcripts.subtitles import Transcript
from sidelinja_worker.queue.queries import load

Q = load("sidelinja_worker.jobs.transcripts")


async def replace_transcript(
    pool: asyncpg.Pool,
    workspace_id: UUID,
    transcript_ref: str,
    transcript: Transcript,
    *,
    language: str | None,
    source: dict[str, Any],
    job_id: UUID | None,
) -> None:
    """Writes `transcript` into `workspace_id`, replacing an earlier parse of the same reference
    in one transaction: a reader sees the old transcript or the new one, never a mix."""
    segs = transcript.segments
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(
            Q["upsert_transcript"],
            workspace_id,
            transcript_ref,
            language,
            source,
            transcript.plain_text,
            transcript.webvtt,
            len(segs),
            transcript.duration_ms,
            job_id,
        )
        await conn.execute(Q["delete_segments"], workspace_id, transcript_ref)
        if segs:
            await conn.execute(
                Q["insert_segments"],
                workspace_id,
                transcript_ref,
                list(range(1, len(segs) + 1)),
                [s.start_ms for s in segs],
                [s.end_ms for s in segs],
                [s.text for s in segs],
            )


async def get_transcript(
    conn: asyncpg.Connection | asyncpg.Pool, workspace_id: UUID, transcript_ref: str
) -> asyncpg.Record | None:
    return await conn.fetchrow(Q["get_transcript"], workspace_id, transcript_ref)


async def get_segments(
    conn: asyncpg.Connection | asyncpg.Pool, workspace_id: UUID, transcript_ref: str
) -> list[asyncpg.Record]:
    rows: list[asyncpg.Record] = await conn.fetch(Q["get_segments"], workspace_id, transcript_ref)
    return rows
