"""`valgomat_generate_profile`: a party programme (a file in the workspace media folder, or
text) and the quiz's statements -> a synthetic candidate profile: a position on every statement
with a short justification citing the programme; schema-validated and stored in
`valgomat_profiles`."""

from __future__ import annotations

import asyncio
import os
from typing import Any, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sidelinja_worker.jobs.ai.common import AiRun, AiTask, run_ai_task
from sidelinja_worker.jobs.knowledge import store as knowledge_store
from sidelinja_worker.jobs.silos import open_media_file
from sidelinja_worker.queue.context import JobContext
from sidelinja_worker.queue.errors import PermanentError, RetryJob
from sidelinja_worker.queue.priorities import default_priority
from sidelinja_worker.queue.registry import JobType

MAX_STATEMENTS = 200
MAX_PROGRAMME_BYTES = 20_000_000


class Statement(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str = Field(min_length=1, max_length=200)
    text: str = Field(min_length=1, max_length=2000)


class ProfilePayload(BaseModel):
    model_config = ConfigDict(frozen=True)

    quiz_id: str = Field(min_length=1, max_length=200)
    party: str = Field(min_length=1, max_length=200)
    programme_path: str | None = Field(
        default=None, min_length=1, max_length=1000
    )  # in the workspace media folder
    programme_text: str | None = Field(default=None, min_length=1)
    statements: list[Statement] = Field(min_length=1, max_length=MAX_STATEMENTS)

    @model_validator(mode="after")
    def _check(self) -> ProfilePayload:
        if (self.programme_path is None) == (self.programme_text is None):
            raise ValueError("give exactly one of programme_path or programme_text")
        ids = [s.id for s in self.statements]
        if len(set(ids)) != len(ids):
            raise ValueError("statement ids must be unique")
        return self


class Position(BaseModel):
    statement_id: str
    position: Literal[-2, -1, 0, 1, 2] | None = Field(
        description="-2 strongly disagree … 2 strongly agree; null when the programme is silent"
    )
    justification: str = Field(min_length=1)
    quote: str | None = Field(description="words from the programme, verbatim, or null")


class Profile(BaseModel):
    summary: str = Field(min_length=1)
    positions: list[Position]


PROMPT = (
    "You build a synthetic candidate profile for a Norwegian election quiz (valgomat) from one "
    "party's programme. For every statement, give the position a typical candidate of this party "
    "would take on the scale -2 (strongly disagree), -1, 0 (neutral), 1, 2 (strongly agree), "
    "or null when the programme says nothing that bears on it. Justify each position in one or "
    "two sentences that cite the programme, and quote the programme's own words (at most 300 "
    "characters, verbatim) where they support the position. Use only the programme; do not use "
    "outside knowledge of the party. Write the justifications in the programme's language. Use "
    "the statement ids exactly as given and answer every statement once."
)
COMBINE_PROMPT = "Merge the partial profiles into one."  # unused: parts are merged locally


def merge(answers: list[Profile]) -> Profile:
    """Parts of a long programme: per statement, the first part that takes a position wins
    (a part silent on a statement must not erase another part's position)."""
    chosen: dict[str, Position] = {}
    for answer in answers:
        for pos in answer.positions:
            current = chosen.get(pos.statement_id)
            if current is None or (current.position is None and pos.position is not None):
                chosen[pos.statement_id] = pos
    return Profile(summary=" ".join(a.summary for a in answers), positions=list(chosen.values()))


TASK = AiTask(
    "valgomat_generate_profile",
    Profile,
    PROMPT,
    COMBINE_PROMPT,
    "Lager kandidatprofil",
    "profile",
    merge=merge,
)


async def programme_of(ctx: JobContext, payload: ProfilePayload) -> str:
    if payload.programme_text is not None:
        return payload.programme_text
    assert payload.programme_path is not None
    media_root = ctx.services.config.require("MEDIA_ROOT")
    text = await asyncio.to_thread(
        read_programme, media_root, ctx.workspace_id, payload.programme_path
    )
    if not text.strip():
        raise PermanentError(f"programme {payload.programme_path!r} is empty")
    return text


def read_programme(media_root: str, workspace_id: UUID, path: str) -> str:
    """The programme file's text, read from the file `open_media_file` opened (no hard link, no
    swap, only a regular file). Blocking: run it in a thread, which closes the file however
    the job ends."""
    with open_media_file(media_root, workspace_id, path) as f:
        size = os.fstat(f.fileno()).st_size
        # Read one byte past the bound at most: a file growing since it was measured stops there.
        data = f.read(MAX_PROGRAMME_BYTES + 1) if size <= MAX_PROGRAMME_BYTES else b""
    if max(size, len(data)) > MAX_PROGRAMME_BYTES:
        raise PermanentError(f"programme {path!r} is over {MAX_PROGRAMME_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise PermanentError(
            f"programme {path!r} is not UTF-8 text (convert PDF or Word files to text first)"
        ) from None


def statements_note(payload: ProfilePayload) -> str:
    listed = "\n".join(f"- [{s.id}] {s.text}" for s in payload.statements)
    return f"Party: {payload.party}\n\nStatements (id in brackets):\n{listed}\n\nProgramme:"


# The quote check runs in a thread, but str.split and str.casefold hold the GIL for the whole of
# the string they are given (0.23 s and 0.18 s on a 17 MB programme): the event loop waits for
# them as if they ran on it. A piece of this many characters takes about a millisecond.
SQUASH_PIECE_CHARS = 1 << 16


def _squash(text: str) -> str:
    """`text`'s words joined by single spaces, casefolded: what a quote and the programme are
    compared as. Done a piece at a time, each piece a short hold of the GIL; a word cut in two
    by a piece's end is glued together again."""
    squashed: list[str] = []
    spaced = False  # whether whitespace came after the last word in `squashed`
    for start in range(0, len(text), SQUASH_PIECE_CHARS):
        piece = text[start : start + SQUASH_PIECE_CHARS]
        words = " ".join(piece.split()).casefold()
        if words:
            if squashed and (spaced or piece[0].isspace()):
                squashed.append(" ")
            squashed.append(words)
            spaced = piece[-1].isspace()
        else:
            spaced = True
    return "".join(squashed)


def checked_positions(
    payload: ProfilePayload, profile: Profile, programme: str
) -> list[dict[str, Any]]:
    """The positions in the statements' order, each marked whether its quote is really in the
    programme. An answer that leaves statements out is asked again (the model varies)."""
    by_id: dict[str, Position] = {}
    for pos in profile.positions:
        by_id.setdefault(pos.statement_id, pos)
    missing = [s.id for s in payload.statements if s.id not in by_id]
    if missing:
        raise RetryJob(
            f"the model's profile left out {len(missing)} statement(s): " + ", ".join(missing[:5])
        )
    text = _squash(programme)
    return [
        {
            **by_id[s.id].model_dump(mode="json"),
            "quote_found": bool(by_id[s.id].quote) and _squash(by_id[s.id].quote or "") in text,
        }
        for s in payload.statements
    ]


async def run(ctx: JobContext, payload: ProfilePayload) -> dict[str, Any]:
    programme = await programme_of(ctx, payload)
    result: AiRun[Profile] = await run_ai_task(ctx, TASK, programme, statements_note(payload))
    profile = {
        "party": payload.party,
        "summary": result.value.summary,
        # In a thread: it squashes the whole programme and searches it once per statement
        # (1.1 s for 17 MB and 200 statements), which the worker's other jobs must not wait for.
        "positions": await asyncio.to_thread(checked_positions, payload, result.value, programme),
    }
    row_id = await knowledge_store.save_profile(
        ctx.services.pool,
        ctx.workspace_id,
        payload.quiz_id,
        payload.party,
        ctx.job_id,
        result.model,
        profile,
    )
    return {
        "profile": profile,
        "profile_id": str(row_id),
        "quiz_id": payload.quiz_id,
        "model": result.model,
        "parts": result.parts,
        "usage": {
            "prompt_tokens": result.usage.prompt_tokens,
            "completion_tokens": result.usage.completion_tokens,
            "calls": result.usage.calls,
        },
    }


JOB_TYPE = JobType(
    name="valgomat_generate_profile",
    handler=run,
    payload_model=ProfilePayload,
    default_priority=default_priority("valgomat_generate_profile"),
    timeout_s=1200,
    description="party programme + quiz statements -> synthetic candidate profile "
    "{quiz_id, party, programme_path | programme_text, statements: [{id, text}]}",
    needs_settings=("AI_GATEWAY_URL", "AI_GATEWAY_KEY"),
)
