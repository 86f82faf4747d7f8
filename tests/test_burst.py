"""Burst mode keeps its promise: it exits only when no due job is left, follow-up jobs committed
with a completion included, and their follow-ups."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from uuid import UUID

import asyncpg

from sidelinja_worker.queue import client
from sidelinja_worker.queue.client import NewJob
from sidelinja_worker.queue.context import JobContext
from sidelinja_worker.queue.registry import Registry
from tests.fakes.fixtures import (  # noqa: F401  (pytest finds fixtures by module name)
    forgejo_fake_fixture,
    media_root_fixture,
    service_config,
    whisper_fake_fixture,
)
from tests.fakes.forgejo_server import FakeForgejo
from tests.fakes.whisper_server import FakeWhisper
from tests.helpers import job_type, run_burst, statuses


async def test_one_burst_runs_whisper_and_its_srt_parse(
    pool: asyncpg.Pool,
    db_url: str,
    workspace: UUID,
    media_root: Path,
    whisper_fake: FakeWhisper,
    forgejo_fake: FakeForgejo,
) -> None:
    body = {
        "audio_path": "episodes/ep1.wav",
        "transcript_ref": "ep-1",
        "forgejo": {"owner": "sidelinja", "repo": "transcripts", "path": "ep-1.srt"},
    }
    await client.enqueue(pool, workspace, "whisper_transcribe", body)
    config = service_config(media_root, whisper=whisper_fake, forgejo=forgejo_fake)
    await run_burst(pool, db_url, config=config)  # once: no second burst to pick up the rest
    rows = await pool.fetch("SELECT job_type, status::text, error_msg FROM job_queue ORDER BY 1")
    assert [(r[0], r[1]) for r in rows] == [
        ("srt_parse", "completed"),
        ("whisper_transcribe", "completed"),
    ], rows


async def _chain(ctx: JobContext, payload: Any) -> dict[str, int]:
    depth = payload.depth
    if depth > 0:
        ctx.enqueue_on_success(NewJob(ctx.workspace_id, "chain", {"depth": depth - 1}))
    return {"depth": depth}


async def test_one_burst_runs_follow_ups_of_follow_ups(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    registry = Registry([job_type("chain", _chain)])
    for _ in range(5):
        await client.enqueue(pool, workspace, "chain", {"depth": 3})
    await run_burst(pool, db_url, registry, max_concurrent=2)
    assert await statuses(pool) == {"completed": 20}
