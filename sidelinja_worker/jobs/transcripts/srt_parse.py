"""`srt_parse`: an SRT (in the workspace media folder or in Forgejo) -> the workspace's transcript tables."""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Iterator
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from sidelinja_worker.jobs.silos import check_repo, open_media_file
from sidelinja_worker.jobs.transcripts import store as transcripts_store
from sidelinja_worker.jobs.transcripts.subtitles import SrtError, Transcript, parse_srt_off_loop
from sidelinja_worker.jobs.transcripts.whisper_transcribe import forgejo_source
from sidelinja_worker.queue.client import NewJob
from sidelinja_worker.queue.context import JobContext
from sidelinja_worker.queue.errors import PermanentError
from sidelinja_worker.queue.priorities import default_priority
from sidelinja_worker.queue.registry import JobType
from sidelinja_worker.services.forgejo import Forgejo, RepoFile, check_repo_name, check_repo_path

# Ten hours of speech is about 1.5 MB of SRT; anything far beyond is not a transcript.
MAX_SRT_BYTES = 20 * 1024 * 1024


class ForgejoSource(BaseModel):
    model_config = ConfigDict(frozen=True)

    owner: Annotated[str, AfterValidator(check_repo_name)]
    repo: Annotated[str, AfterValidator(check_repo_name)]
    path: Annotated[str, Field(min_length=1, max_length=500), AfterValidator(check_repo_path)]
    ref: str | None = Field(default=None, min_length=1, max_length=250)  # branch, tag or commit


class SrtParsePayload(BaseModel):
    model_config = ConfigDict(frozen=True)

    transcript_ref: str = Field(min_length=1, max_length=200)
    srt_path: str | None = Field(
        default=None, min_length=1, max_length=1000
    )  # in the workspace media folder
    forgejo: ForgejoSource | None = None
    language: str | None = Field(default=None, pattern=r"^[a-z]{2,3}$")
    # In a graph: the transcript is then also embedded for the knowledge graph, by a
    # generate_embeddings child this job adds (one item per passage of the transcript).
    embed: bool = False
    # In a graph: the SRT its whisper_transcribe parent committed (read from its result).
    from_parent: bool = False

    @model_validator(mode="after")
    def _one_source(self) -> SrtParsePayload:
        if (self.srt_path is not None) + (self.forgejo is not None) + self.from_parent != 1:
            raise ValueError("give exactly one of srt_path or forgejo (or from_parent)")
        return self


# Passages embedded per transcript: about a minute of speech each. A cue longer than this is
# cut at spaces, so no passage holds more than twice it (an embedding model reads a few
# thousand tokens at most).
PASSAGE_CHARS = 1500
# What one generate_embeddings child carries: a transcript's passages are shared out among as
# many children as these bounds need, so that a long transcript's embeddings stay under a
# job's payload cap (1,000 passages are ~17 hours of speech; 512 kB of text stays under the
# cap even if JSON escapes every character).
PASSAGES_PER_CHILD = 1000
CHILD_TEXT_BYTES = 512 * 1024


async def run_srt_parse(ctx: JobContext, payload: SrtParsePayload) -> Any:
    raw, source = await _load(ctx, payload)
    try:
        text = await asyncio.to_thread(_decode, raw)
        transcript = await parse_srt_off_loop(text)
    except SrtError as exc:
        raise PermanentError(str(exc)) from None
    await ctx.progress("Lagrer transkripsjonen…", 80)
    await transcripts_store.replace_transcript(
        ctx.services.pool,
        ctx.workspace_id,
        payload.transcript_ref,
        transcript,
        language=payload.language,
        source=source,
        job_id=ctx.job_id,
    )
    if payload.embed:
        # Off the loop: joining and cutting 20 MB of text takes a while.
        for items in await asyncio.to_thread(embedding_items, payload.transcript_ref, transcript):
            ctx.add_child(NewJob(ctx.workspace_id, "generate_embeddings", {"items": items}))
    return {
        "transcript_ref": payload.transcript_ref,
        "segments": len(transcript.segments),
        "duration_ms": transcript.duration_ms,
        "characters": len(transcript.plain_text),
        "source": source,
    }


async def _load(ctx: JobContext, payload: SrtParsePayload) -> tuple[bytes, dict[str, Any]]:
    """The SRT's bytes and a description of where they came from (stored with the transcript)."""
    config = ctx.services.config
    if payload.srt_path is not None:
        raw = await asyncio.to_thread(
            _read_media_srt, config.require("MEDIA_ROOT"), ctx, payload.srt_path
        )
        return raw, {"path": payload.srt_path}
    src = payload.forgejo or await _parent_source(ctx)
    forgejo = Forgejo.from_config(ctx.services.http, config)
    check_repo(await ctx.workspace_settings(), src.owner, src.repo)
    state = await forgejo.read(RepoFile(src.owner, src.repo, src.path, src.ref))
    if state is None:
        where = f"{src.owner}/{src.repo}/{src.path}" + (f" at {src.ref}" if src.ref else "")
        raise PermanentError(f"Forgejo has no file {where}")
    if len(state.content) > MAX_SRT_BYTES:
        raise PermanentError(f"Forgejo's {src.path!r} is over {MAX_SRT_BYTES} bytes: not an SRT")
    return state.content, {"forgejo": {**src.model_dump(), "sha": state.sha}}


def _read_media_srt(media_root: str, ctx: JobContext, path: str) -> bytes:
    """The SRT's bytes, read from the one open file that was checked (`open_media_file`), and
    at most MAX_SRT_BYTES of them: a file that grows after its size is known is refused, not
    read to its new end."""
    with open_media_file(media_root, ctx.workspace_id, path) as f:
        too_big = os.fstat(f.fileno()).st_size > MAX_SRT_BYTES
        raw = b"" if too_big else f.read(MAX_SRT_BYTES + 1)
    if too_big or len(raw) > MAX_SRT_BYTES:
        raise PermanentError(f"{path!r} is over {MAX_SRT_BYTES} bytes: not an SRT")
    return raw


async def _parent_source(ctx: JobContext) -> ForgejoSource:
    """No source in the payload: the SRT its whisper_transcribe parent committed."""
    try:
        result = await ctx.parent_result("whisper_transcribe")
    except LookupError:
        raise PermanentError("from_parent, but it has no whisper_transcribe parent") from None
    forgejo = result["forgejo"]
    return ForgejoSource.model_validate(forgejo_source(forgejo, forgejo.get("commit_sha")))


def embedding_items(transcript_ref: str, transcript: Transcript) -> list[list[dict[str, str]]]:
    """The items of each generate_embeddings child: the transcript's passages, numbered
    `ref#1`, `ref#2`, ... across the children, at most PASSAGES_PER_CHILD and about
    CHILD_TEXT_BYTES of text to a child."""
    children: list[list[dict[str, str]]] = []
    items: list[dict[str, str]] = []
    size = 0
    for i, text in enumerate(passages(transcript), 1):
        length = len(text.encode())
        if items and (len(items) == PASSAGES_PER_CHILD or size + length > CHILD_TEXT_BYTES):
            children.append(items)
            items, size = [], 0
        items.append({"ref": f"{transcript_ref}#{i}", "text": text})
        size += length
    if items:
        children.append(items)
    return children


def passages(transcript: Transcript) -> list[str]:
    """The transcript's segments joined into passages of about PASSAGE_CHARS characters, none
    over twice that."""
    out: list[str] = []
    current: list[str] = []
    size = 0
    for segment in transcript.segments:
        for text in _pieces(" ".join(segment.text.split())):
            current.append(text)
            size += len(text) + 1
            if size >= PASSAGE_CHARS:
                out.append(" ".join(current))
                current, size = [], 0
    if current:
        out.append(" ".join(current))
    return out


def _pieces(text: str) -> Iterator[str]:
    """`text` (its spaces single) in pieces of at most PASSAGE_CHARS, cut at the last space
    before the bound, or at the bound in a word that long. By index: slicing the rest off at
    each cut would copy a 20 MB cue thousands of times."""
    start, end = 0, len(text)
    while end - start > PASSAGE_CHARS:
        cut = text.rfind(" ", start, start + PASSAGE_CHARS + 1)
        if cut <= start:
            cut = start + PASSAGE_CHARS
            yield text[start:cut]
            start = cut
        else:
            yield text[start:cut]
            start = cut + 1
    if start < end:
        yield text[start:]


# A well-formed UTF-8 sequence of two to four bytes. Windows-1252 text almost never holds one
# (a letter from C2-F4 followed by one from 80-BF: "Ã¥" written on purpose), UTF-8 text with
# any letter past ASCII always does.
_UTF8_SEQUENCE = re.compile(
    rb"[\xc2-\xdf][\x80-\xbf]|[\xe0-\xef][\x80-\xbf]{2}|[\xf0-\xf4][\x80-\xbf]{3}"
)


def _decode(raw: bytes) -> str:
    """UTF-8 (a BOM is fine); else Windows-1252, which older Norwegian subtitle tools write.

    A UTF-8 file with a stray byte (a Latin-1 "é" pasted into one cue, a file cut mid-letter)
    is still UTF-8: read as Windows-1252, every æ, ø and å of every cue was stored as "Ã¦",
    "Ã¸", "Ã¥" and the job completed. A file that holds more UTF-8 sequences than bytes that
    are no UTF-8 is read as UTF-8, each stray byte as U+FFFD."""
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        pass
    sequences = len(_UTF8_SEQUENCE.findall(raw))
    if sequences:
        text = raw.decode("utf-8-sig", "replace")
        if text.count("\ufffd") < sequences:
            return text
    try:
        return raw.decode("cp1252")
    except UnicodeDecodeError as exc:
        raise PermanentError(
            f"the SRT is neither UTF-8 nor Windows-1252 (byte {exc.start})"
        ) from None


JOB_TYPE = JobType(
    name="srt_parse",
    handler=run_srt_parse,
    payload_model=SrtParsePayload,
    default_priority=default_priority("srt_parse"),
    timeout_s=300,
    description="SRT -> transcript (segments, plain text, WebVTT) in the workspace; "
    "{transcript_ref, srt_path | forgejo: {owner, repo, path, ref} | from_parent (a "
    "whisper_transcribe parent's SRT), language, embed}",
)
