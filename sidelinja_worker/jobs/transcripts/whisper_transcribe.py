"""`whisper_transcribe`: audio file -> SRT (whisper) -> commit to Forgejo -> `srt_parse` queued."""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated, Any, BinaryIO

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from sidelinja_worker.jobs.silos import check_repo, open_media_file
from sidelinja_worker.jobs.transcripts.governor import Route, choose_whisper
from sidelinja_worker.jobs.transcripts.subtitles import SrtError, Transcript, parse_srt_off_loop
from sidelinja_worker.queue.client import NewJob
from sidelinja_worker.queue.context import JobContext
from sidelinja_worker.queue.errors import PermanentError, RetryJob
from sidelinja_worker.queue.priorities import default_priority
from sidelinja_worker.queue.registry import JobType
from sidelinja_worker.services import whisper
from sidelinja_worker.services.forgejo import (
    Commit,
    Forgejo,
    RepoFile,
    check_repo_name,
    check_repo_path,
)

log = logging.getLogger("sidelinja_worker.job")

# A transient Forgejo failure at the commit is waited out here (these waits, or the answer's
# Retry-After) before the job itself fails: a retry of the job sends the audio to whisper
# again, hours of its work for one 503 of Forgejo's.
COMMIT_RETRY_S = (2.0, 10.0, 30.0)
COMMIT_WAIT_MAX_S = 60.0  # a Retry-After further out fails the job, which keeps that wait


class ForgejoTarget(BaseModel):
    model_config = ConfigDict(frozen=True)

    owner: Annotated[str, AfterValidator(check_repo_name)]
    repo: Annotated[str, AfterValidator(check_repo_name)]
    path: Annotated[str, Field(min_length=1, max_length=500), AfterValidator(check_repo_path)]
    branch: str | None = Field(default=None, min_length=1, max_length=250)  # None: default branch


class WhisperTranscribePayload(BaseModel):
    model_config = ConfigDict(frozen=True)

    audio_path: str = Field(min_length=1, max_length=1000)  # in the workspace media folder
    transcript_ref: str = Field(min_length=1, max_length=200)
    language: str = Field(default="no", pattern=r"^[a-z]{2,3}$")  # whisper codes: no, nn, en
    forgejo: ForgejoTarget
    model: str | None = Field(default=None, min_length=1)  # None: WHISPER_MODEL


async def run_whisper_transcribe(ctx: JobContext, payload: WhisperTranscribePayload) -> Any:
    config = ctx.services.config
    check_repo(await ctx.workspace_settings(), payload.forgejo.owner, payload.forgejo.repo)
    # Opened once, before anything is asked of a service: the upload sends this very file,
    # whatever its name leads to by then.
    audio = await _open_audio(config.require("MEDIA_ROOT"), ctx, payload.audio_path)
    model = payload.model or config.get("WHISPER_MODEL") or whisper.DEFAULT_MODEL
    with audio:  # closed however the job ends: answered, failed, deferred or cancelled
        route = await choose_whisper(ctx.services.http, config)
        log.info("job %s whisper_transcribe: %s", ctx.job_id, route.reason)
        request = whisper.TranscribeRequest(audio, model, payload.language)
        srt_text = await _transcribe(ctx, route, request)
    transcript = await _checked(srt_text)
    await ctx.progress("Lagrer transkripsjonen i Forgejo…", 85)
    commit = await _commit(ctx, payload, srt_text, model)
    # In a graph made with its srt_parse (the episode pipeline), that child reads this job's
    # result; on its own, it adds the parse as its child, pinned to the commit just made.
    if not await ctx.has_child("srt_parse"):
        follow_up = _srt_parse_payload(payload, commit)
        ctx.add_child(NewJob(ctx.workspace_id, "srt_parse", follow_up))
    return {
        "transcript_ref": payload.transcript_ref,
        "audio_path": payload.audio_path,
        "language": payload.language,
        "model": model,
        "governor": route.record(),
        "segments": len(transcript.segments),
        "duration_ms": transcript.duration_ms,
        "srt_bytes": len(srt_text.encode()),
        "forgejo": {
            **payload.forgejo.model_dump(),
            "action": commit.action,
            "blob_sha": commit.blob_sha,
            "commit_sha": commit.commit_sha,
        },
    }


async def _open_audio(media_root: str, ctx: JobContext, path: str) -> BinaryIO:
    """The audio file as `open_media_file` opens it (refusing a hard link, a swap, anything but
    a regular file), opened in a thread. A job cancelled while the thread runs closes the file
    the thread goes on to open."""
    opening = asyncio.ensure_future(
        asyncio.to_thread(open_media_file, media_root, ctx.workspace_id, path)
    )
    try:
        return await asyncio.shield(opening)
    except asyncio.CancelledError:
        opening.add_done_callback(_close_opened)
        raise


def _close_opened(opening: asyncio.Future[BinaryIO]) -> None:
    if not opening.cancelled() and opening.exception() is None:
        opening.result().close()


async def _transcribe(ctx: JobContext, route: Route, req: whisper.TranscribeRequest) -> str:
    """Upload (progress 5-30 %), then wait for the whole transcription (30 %)."""
    await ctx.progress("Laster opp lydfilen…", 5)
    reported = [0]

    async def on_upload(sent: int, total: int) -> None:
        step = 10 * sent // max(total, 1)  # one report per tenth, not per chunk
        if sent >= total:
            await ctx.progress("Venter på transkripsjonen…", 30)
        elif step > reported[0]:
            reported[0] = step
            await ctx.progress(f"Laster opp lydfilen… {10 * step} %", 5 + 2.5 * step)

    api_key = ctx.services.config.get("WHISPER_API_KEY")
    server = whisper.WhisperServer(
        route.url, ctx.services.config.secret("WHISPER_API_KEY") if api_key else None
    )
    return await whisper.transcribe_srt(ctx.services.http, server, req, on_upload)


async def _checked(srt_text: str) -> Transcript:
    try:
        return await parse_srt_off_loop(srt_text)
    except SrtError as exc:
        raise PermanentError(f"whisper answered 200 but not with valid SRT: {exc}") from None


async def _commit(
    ctx: JobContext, payload: WhisperTranscribePayload, srt_text: str, model: str
) -> Commit:
    forgejo = Forgejo.from_config(ctx.services.http, ctx.services.config)
    target = payload.forgejo
    file = RepoFile(target.owner, target.repo, target.path, target.branch)
    message = f"Transcript {payload.transcript_ref} (whisper {model}, language {payload.language})"
    for wait_s in COMMIT_RETRY_S:
        try:
            return await forgejo.write(file, srt_text.encode(), message)
        except RetryJob as exc:
            if exc.after_s is not None:
                if exc.after_s > COMMIT_WAIT_MAX_S:
                    raise
                wait_s = exc.after_s
            log.info("job %s: %s; committing again in %g s", ctx.job_id, exc, wait_s)
            await ctx.progress(f"Forgejo svarte ikke; prøver igjen om {wait_s:g} s…", 85)
            await asyncio.sleep(wait_s)
    return await forgejo.write(file, srt_text.encode(), message)


def _srt_parse_payload(payload: WhisperTranscribePayload, commit: Commit) -> dict[str, Any]:
    """Pinned to the commit just made, so the parse reads exactly this SRT even if the branch
    moves on before it runs."""
    target = payload.forgejo
    return {
        "transcript_ref": payload.transcript_ref,
        "language": payload.language,
        "forgejo": forgejo_source(target.model_dump(), commit.commit_sha),
    }


def forgejo_source(target: dict[str, Any], commit_sha: str | None) -> dict[str, Any]:
    """Where srt_parse reads the SRT this job committed: `target` as in the payload (or the
    result), at the commit made."""
    return {
        "owner": target["owner"],
        "repo": target["repo"],
        "path": target["path"],
        "ref": commit_sha or target.get("branch"),
    }


JOB_TYPE = JobType(
    name="whisper_transcribe",
    handler=run_whisper_transcribe,
    payload_model=WhisperTranscribePayload,
    default_priority=default_priority("whisper_transcribe"),
    timeout_s=4 * 3600,  # above whisper's 3 h read timeout, so that one reports first
    description="audio file -> SRT (whisper) committed to Forgejo, then srt_parse; "
    "{audio_path, transcript_ref, language, forgejo: {owner, repo, path, branch}}",
    needs_settings=("WHISPER_URL", "MEDIA_ROOT", "FORGEJO_URL", "FORGEJO_TOKEN"),
)
