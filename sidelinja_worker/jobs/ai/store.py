"""One typed async function per named query in sql/ai.sql: AI results and transcript reads, always
inside one workspace."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from sidelinja_worker.queue.db import Conn
from sidelinja_worker.queue.errors import PermanentError
from sidelinja_worker.queue.queries import load

Q = load("sidelinja_worker.jobs.ai")


async def save_result(
    conn: Conn,
    workspace_id: UUID,
    kind: str,
    source_ref: str,
    job_id: UUID,
    model: str,
    result: dict[str, Any],
) -> UUID:
    """Stores (or replaces) the answer for this workspace, job type and source."""
    return await conn.fetchval(
        Q["save_ai_result"], workspace_id, kind, source_ref, job_id, model, result
    )


# The most transcript text an AI job reads: srt_parse stores at most ~25 MB (from an SRT of
# its 20 MB cap, with the lines' times); any other writer's row is refused past it, unread.
MAX_TRANSCRIPT_BYTES = 32 * 1024 * 1024


async def transcript_text(conn: Conn, workspace_id: UUID, transcript_ref: str) -> str | None:
    """The transcript as `[H:MM:SS] text` lines (so chapters can carry times), its plain text if
    it has no segments, or None when this workspace has no such transcript. One of more than
    MAX_TRANSCRIPT_BYTES is a PermanentError, and never comes over the connection."""
    for query in ("transcript_lines", "transcript_plain_text"):
        row = await conn.fetchrow(Q[query], workspace_id, transcript_ref, MAX_TRANSCRIPT_BYTES)
        if row is None or row[1] is None:
            continue
        if row[0] is None:
            raise PermanentError(
                f"transcript {transcript_ref!r} is {row[1]:,} bytes of text, over the"
                f" {MAX_TRANSCRIPT_BYTES:,} an AI job reads"
            )
        return str(row[0])
    return None
