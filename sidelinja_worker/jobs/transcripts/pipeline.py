"""The episode pipeline as one job graph: whisper_transcribe -> srt_parse -> openrouter_analyze,
and srt_parse adds generate_embeddings for the transcript's passages. The same graph is one SQL
statement for the web app (docs/workflows.md)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any
from uuid import UUID

from sidelinja_worker.queue import client
from sidelinja_worker.queue.client import NewJob
from sidelinja_worker.queue.db import Conn
from sidelinja_worker.queue.ids import uuid7s


@dataclass(frozen=True)
class Episode:
    workspace_id: UUID
    audio_path: str  # under MEDIA_ROOT
    owner: str  # the Forgejo repository the SRT is committed to
    repo: str
    transcript_ref: str | None = None  # default: the audio file's name without its suffix
    srt_path: str | None = None  # in the repository; default: transcripts/<ref>.srt
    branch: str | None = None
    language: str = "no"
    title: str | None = None
    embed: bool = True


def episode_jobs(episode: Episode) -> list[NewJob]:
    """The graph's jobs, each naming its parents (ids fixed here)."""
    ref = episode.transcript_ref or PurePosixPath(episode.audio_path).stem
    transcribe_id, parse_id = uuid7s(2)
    forgejo: dict[str, Any] = {
        "owner": episode.owner,
        "repo": episode.repo,
        "path": episode.srt_path or f"transcripts/{ref}.srt",
    }
    if episode.branch:
        forgejo["branch"] = episode.branch
    ws = episode.workspace_id
    analyze: dict[str, Any] = {"transcript_ref": ref}
    if episode.title:
        analyze["title"] = episode.title
    return [
        NewJob(
            ws,
            "whisper_transcribe",
            {
                "audio_path": episode.audio_path,
                "transcript_ref": ref,
                "language": episode.language,
                "forgejo": forgejo,
            },
            job_id=transcribe_id,
        ),
        NewJob(
            ws,
            "srt_parse",
            {
                "transcript_ref": ref,
                "language": episode.language,
                "from_parent": True,
                "embed": episode.embed,
            },
            job_id=parse_id,
            parents=(transcribe_id,),
        ),
        NewJob(ws, "openrouter_analyze", analyze, parents=(parse_id,)),
    ]


async def enqueue_episode(conn: Conn, episode: Episode) -> dict[str, UUID]:
    """Enqueues the pipeline in one transaction; the job ids by job type."""
    jobs = episode_jobs(episode)
    ids = await client.enqueue_many(conn, jobs)
    return {job.job_type: job_id for job, job_id in zip(jobs, ids, strict=True)}
