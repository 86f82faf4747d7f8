"""One typed async function per named query in sql/ai.sql: AI results and transcript reads, always
inside one workspace."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from sidelinja_worker.queue.db import Conn
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


async def transcript_text(conn: Conn, workspace_id: UUID, transcript_ref: str) -> str | None:
    """The transcript as `[H:MM:SS] text` lines (so chapters can carry times), its plain text if
    it has no segments, or None when this workspace has no such transcript."""
    lines = await conn.fetchval(Q["transcript_lines"], workspace_id, transcript_ref)
    if lines is not None:
        return lines
    return await conn.fetchval(Q["transcript_plain_text"], workspace_id, transcript_ref)
