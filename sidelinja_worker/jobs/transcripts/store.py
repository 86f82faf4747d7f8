"""One typed async function per named query in sql/transcripts.sql: the transcript tables."""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import UUID

import asyncpg

from sidelinja_worker.jobs.transcripts.subtitles import Transcript
from sidelinja_worker.queue.queries import load

Q = load("sidelinja_worker.jobs.transcripts")


# asyncpg encodes a statement's arrays on the event loop: 200,000 segments in one statement
# held it ~0.13 s, this many ~15 ms.
SEGMENTS_PER_STATEMENT = 20_000


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
    in one transaction: a reader sees the old transcript or the new one, never a mix. Its texts
    and columns are built in a thread: for a long file that is most of a second (0.75 s for an
    18.5 MB SRT), which on the event loop would hold every other job of the worker."""
    plain, vtt, duration_ms, starts, ends, texts = await asyncio.to_thread(_columns, transcript)
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(
            Q["upsert_transcript"],
            workspace_id,
            transcript_ref,
            language,
            source,
            plain,
            vtt,
            len(texts),
            duration_ms,
            job_id,
        )
        await conn.execute(Q["delete_segments"], workspace_id, transcript_ref)
        for at in range(0, len(texts), SEGMENTS_PER_STATEMENT):
            part = slice(at, at + SEGMENTS_PER_STATEMENT)
            await conn.execute(
                Q["insert_segments"],
                workspace_id,
                transcript_ref,
                list(range(at + 1, at + 1 + len(texts[part]))),
                starts[part],
                ends[part],
                texts[part],
            )


def _columns(
    transcript: Transcript,
) -> tuple[str, str, int, list[int], list[int], list[str]]:
    segs = transcript.segments
    return (
        transcript.plain_text,
        transcript.webvtt,
        transcript.duration_ms,
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
