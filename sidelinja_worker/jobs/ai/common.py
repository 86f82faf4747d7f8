"""What the AI job types share: the workspace's AI settings, prompts with its name list, the
map-reduce over inputs longer than the context budget, and storing the answer in the job's
workspace.

Workspace settings read (all optional; `workspaces.settings`):
    ai.model            model for every AI job type (default DEFAULT_MODEL)
    ai.context_tokens   input budget per request, in tokens (default DEFAULT_CONTEXT_TOKENS)
    ai.names            people and places, spelled right; put into every prompt
    ai.models, ai.max_paid_calls_per_job   what a job may call and how often (jobs/silos.py)
    ai.<job_type>.model / .prompt / .combine_prompt / .context_tokens   per job type overrides
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sidelinja_worker.jobs.ai import store as ai_store
from sidelinja_worker.jobs.ai.text import budget_chars, group_for_combine, split_text
from sidelinja_worker.jobs.silos import call_guard, check_planned_calls
from sidelinja_worker.queue.context import JobContext
from sidelinja_worker.queue.errors import PermanentError
from sidelinja_worker.queue.registry import describe_validation_error
from sidelinja_worker.services.ai_answers import Usage
from sidelinja_worker.services.ai_gateway import AiGateway

# A cheap model that supports strict structured outputs on OpenRouter; workspaces pick their own.
DEFAULT_MODEL = "openai/gpt-4o-mini"
# Fits a 32k-token model with room for the prompt and the answer; a big-context model can be
# given more per workspace.
DEFAULT_CONTEXT_TOKENS = 24_000
MAX_NAMES = 500

M = TypeVar("M", bound=BaseModel)
S = TypeVar("S", bound=BaseModel)


class TranscriptSource(BaseModel):
    """The input of a transcript-based job: a transcript stored by `srt_parse` in this
    workspace (`transcript_ref`), or the text inline (`text`). Exactly one."""

    model_config = ConfigDict(frozen=True)

    transcript_ref: str | None = Field(default=None, min_length=1)
    text: str | None = Field(default=None, min_length=1)
    ref: str | None = Field(
        default=None,
        min_length=1,
        description="the platform's id for the result (default: transcript_ref)",
    )

    @model_validator(mode="after")
    def _one_source(self) -> TranscriptSource:
        if (self.transcript_ref is None) == (self.text is None):
            raise ValueError("give exactly one of transcript_ref or text")
        return self


class JobAiSettings(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = Field(default=None, min_length=1)
    prompt: str | None = Field(default=None, min_length=1)
    combine_prompt: str | None = Field(default=None, min_length=1)
    context_tokens: int | None = Field(default=None, ge=50)


class WorkspaceAiSettings(JobAiSettings):
    names: list[str] = Field(default_factory=list, max_length=MAX_NAMES)


@dataclass(frozen=True)
class AiSettings:
    model: str
    prompt: str
    combine_prompt: str
    names: tuple[str, ...]
    context_tokens: int


@dataclass(frozen=True)
class AiTask(Generic[M]):
    """One AI job type's fixed parts. `merge`, when given, combines the answers for the parts of
    a split input locally instead of asking the model (where nothing may be summarised away)."""

    job_type: str
    answer: type[M]
    prompt: str
    combine_prompt: str
    label: str
    result_key: str
    merge: Callable[[list[M]], M] | None = None


@dataclass(frozen=True)
class AiRun(Generic[M]):
    value: M
    model: str
    parts: int
    usage: Usage


def resolve_settings(settings: Mapping[str, Any], task: AiTask[Any]) -> AiSettings:
    """The workspace's settings for `task` over the built-in defaults; bad settings fail the job
    (a retry would not fix them) naming the key."""
    raw = settings.get("ai") or {}
    ws = _validated(WorkspaceAiSettings, raw, "ai")
    job = _validated(JobAiSettings, raw.get(task.job_type) or {}, f"ai.{task.job_type}")
    return AiSettings(
        model=job.model or ws.model or DEFAULT_MODEL,
        prompt=job.prompt or task.prompt,
        combine_prompt=job.combine_prompt or task.combine_prompt,
        names=tuple(n.strip() for n in ws.names if n.strip()),
        context_tokens=job.context_tokens or ws.context_tokens or DEFAULT_CONTEXT_TOKENS,
    )


def _validated(model: type[S], raw: Any, where: str) -> S:
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise PermanentError(
            f"workspace settings {where}: {describe_validation_error(exc)}"
        ) from None


def system_message(prompt: str, names: Sequence[str]) -> dict[str, str]:
    if not names:
        return {"role": "system", "content": prompt}
    listed = "\n".join(f"- {name}" for name in names)
    return {
        "role": "system",
        "content": f"{prompt}\n\nNames in this workspace. When one of them "
        f"occurs (even misheard or misspelled), spell it exactly like this:\n{listed}",
    }


def user_message(text: str, note: str, part: int, parts: int) -> dict[str, str]:
    header = [note] if note else []
    if parts > 1:
        header.append(f"This is part {part} of {parts} of one text. Answer for this part only.")
    return {"role": "user", "content": "\n\n".join([*header, text])}


async def run_ai_task(ctx: JobContext, task: AiTask[M], text: str, note: str = "") -> AiRun[M]:
    """Asks the gateway for `task.answer` about `text`; a text over the context budget is split
    into parts, each part answered, and the answers combined."""
    raw = await ctx.workspace_settings()
    settings = resolve_settings(raw, task)
    guard = call_guard(raw, (DEFAULT_MODEL,))
    guard.allow_model(settings.model)
    gateway = AiGateway.from_services(ctx.services, guard)
    parts = await asyncio.to_thread(split_text, text, budget_chars(settings.context_tokens))
    # Each part is a call and, without a local merge, combining takes at most one call fewer.
    combine = len(parts) - 1 if task.merge is None else 0
    check_planned_calls(guard, len(parts) + combine, f"a text in {len(parts)} parts")
    system = system_message(settings.prompt, settings.names)
    answers: list[M] = []
    usage = Usage()
    for i, part in enumerate(parts, 1):
        await ctx.progress(f"{task.label} ({i}/{len(parts)})…", 10 + 80 * (i - 1) / len(parts))
        got = await gateway.structured(
            settings.model, [system, user_message(part, note, i, len(parts))], task.answer
        )
        answers.append(got.value)
        usage += got.usage
    if len(answers) > 1:
        await ctx.progress(f"{task.label}: setter sammen {len(answers)} deler…", 90)
    value, more = await combine_answers(gateway, task, settings, answers, note)
    return AiRun(value, settings.model, len(parts), usage + more)


async def combine_answers(
    gateway: AiGateway, task: AiTask[M], settings: AiSettings, answers: list[M], note: str
) -> tuple[M, Usage]:
    """One answer from the parts' answers: locally with `task.merge`, else by asking the model in
    rounds of groups that fit the budget (a combined answer can itself be over the budget)."""
    if len(answers) > 1 and task.merge is not None:
        # Parts answered with thousands of items each: merged on the loop, ten parts of 15,000
        # tasks held it 0.06-0.16 s. A thread gives the loop the GIL between its steps.
        return await asyncio.to_thread(task.merge, answers), Usage()
    usage = Usage()
    system = system_message(settings.combine_prompt, settings.names)
    while len(answers) > 1:
        texts = await asyncio.to_thread(_each_as_json, answers)
        groups = group_for_combine(texts, budget_chars(settings.context_tokens))
        answers = []
        for group in groups:
            listed = "\n\n".join(f"Part {i}:\n{item}" for i, item in enumerate(group, 1))
            text = f"Partial answers for consecutive parts of one text, in order:\n\n{listed}"
            got = await gateway.structured(
                settings.model, [system, user_message(text, note, 1, 1)], task.answer
            )
            answers.append(got.value)
            usage += got.usage
    return answers[0], usage


def _each_as_json(answers: list[M]) -> list[str]:
    """Each answer as JSON, in a thread: 60 parts of 13,000 items took 0.25 s, which on the
    loop held every job. Pydantic holds the GIL through one answer, so the loop gets it back
    between two."""
    texts = []
    for answer in answers:
        texts.append(answer.model_dump_json())
        time.sleep(0)
    return texts


async def source_text(ctx: JobContext, source: TranscriptSource) -> str:
    """The inline text, or the transcript of this workspace (never another's)."""
    if source.text is not None:
        return source.text
    assert source.transcript_ref is not None
    text = await ai_store.transcript_text(
        ctx.services.pool, ctx.workspace_id, source.transcript_ref
    )
    if text is None:
        raise PermanentError(f"transcript {source.transcript_ref!r} not found in this workspace")
    if not text.strip():
        raise PermanentError(f"transcript {source.transcript_ref!r} is empty")
    return text


async def store_result(
    ctx: JobContext, task: AiTask[M], run: AiRun[M], source_ref: str | None
) -> dict[str, Any]:
    """Saves the answer in `ai_results` of the job's workspace and returns the job's result."""
    result = {
        task.result_key: run.value.model_dump(mode="json"),
        "model": run.model,
        "parts": run.parts,
        "usage": asdict(run.usage),
    }
    ref = source_ref or f"job:{ctx.job_id}"
    row_id = await ai_store.save_result(
        ctx.services.pool, ctx.workspace_id, task.job_type, ref, ctx.job_id, run.model, result
    )
    return {**result, "source_ref": ref, "ai_result_id": str(row_id)}
