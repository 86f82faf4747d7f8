"""`dictation_cleanup`: a dictated transcript -> a structured note (title, body, tasks) that
keeps the speaker's meaning; stored in `ai_results`."""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, Field

from sidelinja_worker.jobs.ai.common import (
    AiTask,
    TranscriptSource,
    run_ai_task,
    source_text,
    store_result,
)
from sidelinja_worker.queue.context import JobContext
from sidelinja_worker.queue.priorities import default_priority
from sidelinja_worker.queue.registry import JobType


class NoteTask(BaseModel):
    what: str = Field(min_length=1)
    due: str | None = Field(default=None, description="when it is due, as said; null if not said")


class Note(BaseModel):
    title: str = Field(min_length=1)
    body: str = Field(min_length=1, description="the cleaned-up text, Markdown paragraphs")
    tasks: list[NoteTask]


PROMPT = (
    "You turn a dictated transcript into a clean note for Sidelinja, a Norwegian media "
    "platform. Remove filler words, false starts, repetitions and dictation commands; fix "
    "punctuation and paragraphs. Keep the speaker's meaning and wording: do not summarise, add "
    "or reinterpret. Give the note a short title, and list each thing the speaker says must be "
    "done as a task, with its due time when said. Write in the language of the dictation."
)


def merge_notes(notes: list[Note]) -> Note:
    """A split dictation is joined here, not by the model, so no part's text is summarised away.
    A task said in several parts is kept once, where it first came. Deduplicated by key: a
    model that loops can answer with thousands of tasks, which a scan of the kept list for each
    one made quadratic. common.combine_answers runs it in a thread."""
    tasks: dict[tuple[str, str | None], NoteTask] = {}
    for note in notes:
        for task in note.tasks:
            tasks.setdefault((task.what, task.due), task)
        # Hands the GIL to the event loop, which else waits up to the 5 ms switch interval
        # each time it takes the GIL back after a system call.
        time.sleep(0)
    body = "\n\n".join(n.body.strip() for n in notes)
    # Built from valid notes: not validated again, which is one call holding the GIL.
    return Note.model_construct(title=notes[0].title, body=body, tasks=list(tasks.values()))


TASK = AiTask("dictation_cleanup", Note, PROMPT, "", "Rydder diktat", "note", merge=merge_notes)


async def run(ctx: JobContext, payload: TranscriptSource) -> dict[str, Any]:
    text = await source_text(ctx, payload)
    result = await run_ai_task(ctx, TASK, text)
    return await store_result(ctx, TASK, result, payload.ref or payload.transcript_ref)


JOB_TYPE = JobType(
    name="dictation_cleanup",
    handler=run,
    payload_model=TranscriptSource,
    default_priority=default_priority("dictation_cleanup"),
    timeout_s=600,
    description="dictated transcript -> note: title, body, tasks {transcript_ref | text, ref?}",
    needs_settings=("AI_GATEWAY_URL", "AI_GATEWAY_KEY"),
)
