"""`valgomat_moderation`: a user-submitted quiz question -> the closest existing question of the
same quiz by embedding similarity (a duplicate over the workspace's threshold), and a neutral
rewrite with flags for leading or loaded wording; stored in `valgomat_moderation` for a
moderator to approve.

The similarity is computed in Python over the quiz's stored question vectors (real[]), not with
pgvector: a quiz has at most a few hundred questions, and the check then works on any
PostgreSQL. Workspace settings: `valgomat.duplicate_threshold` (cosine, default 0.9), the
embedding settings of knowledge_common, and `ai.valgomat_moderation.model/prompt`."""

from __future__ import annotations

import asyncio
from dataclasses import asdict
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sidelinja_worker.jobs.ai.common import (
    DEFAULT_MODEL,
    AiTask,
    resolve_settings,
    system_message,
)
from sidelinja_worker.jobs.knowledge import store as knowledge_store
from sidelinja_worker.jobs.knowledge.common import (
    DEFAULT_EMBEDDING_MODEL,
    EmbeddingSettings,
    content_hash,
    cosine,
    embed_all,
    embedding_settings,
)
from sidelinja_worker.jobs.knowledge.store import NewEmbedding, QuizQuestion
from sidelinja_worker.jobs.silos import call_guard
from sidelinja_worker.queue.context import JobContext
from sidelinja_worker.queue.errors import PermanentError
from sidelinja_worker.queue.priorities import default_priority
from sidelinja_worker.queue.registry import JobType, describe_validation_error
from sidelinja_worker.services.ai_gateway import AiGateway

DEFAULT_THRESHOLD = 0.9
SHOWN_CANDIDATES = 3


class ModerationPayload(BaseModel):
    model_config = ConfigDict(frozen=True)

    quiz_id: str = Field(min_length=1, max_length=200)
    question: str = Field(min_length=1, max_length=2000)
    submission_ref: str | None = Field(
        default=None,
        min_length=1,
        max_length=500,
        description="the platform's id of the submission (default job:<id>)",
    )


class ValgomatSettings(BaseModel):
    model_config = ConfigDict(extra="ignore")

    duplicate_threshold: float = Field(default=DEFAULT_THRESHOLD, gt=0, le=1)


Flag = Literal[
    "leading", "loaded_language", "double_barrelled", "presupposition", "unclear", "offensive"
]


class Review(BaseModel):
    neutral_question: str = Field(min_length=1)
    leading: bool
    loaded_terms: list[str] = Field(description="loaded or value-laden words, verbatim")
    flags: list[Flag]
    explanation: str


PROMPT = (
    "You moderate questions that users submit to a Norwegian election quiz (valgomat). Rewrite "
    "the question so it is neutral: one issue only, no loaded or value-laden words, no "
    "presupposition, answerable with agree/disagree, in the question's own language and as "
    "short as the original allows. Flag what was wrong: leading (suggests an answer), "
    "loaded_language (list those words in loaded_terms), double_barrelled (two issues), "
    "presupposition, unclear, offensive. Explain briefly. If the question is already neutral, "
    "return it unchanged with no flags."
)
TASK = AiTask("valgomat_moderation", Review, PROMPT, PROMPT, "Modererer spørsmål", "review")


def valgomat_settings(raw: dict[str, Any]) -> ValgomatSettings:
    try:
        return ValgomatSettings.model_validate(raw.get("valgomat") or {})
    except ValidationError as exc:
        raise PermanentError(
            f"workspace settings valgomat: {describe_validation_error(exc)}"
        ) from None


def stale(q: QuizQuestion, model: str) -> bool:
    return (
        q.embedding is None
        or q.embedding_model != model
        or q.embedding_sha256 != content_hash(q.text)
    )


async def question_vectors(
    ctx: JobContext, gateway: AiGateway, settings: EmbeddingSettings, quiz_id: str, question: str
) -> tuple[list[float], dict[str, list[float]], dict[str, int]]:
    """The submission's vector and every quiz question's, embedding (and storing) those missing
    or edited since, in the same requests as the submission."""
    questions = await knowledge_store.quiz_questions(ctx.services.pool, ctx.workspace_id, quiz_id)
    todo = [q for q in questions if stale(q, settings.model)]
    got = await embed_all(
        ctx,
        gateway,
        settings,
        [question, *(q.text for q in todo)],
        "Sammenligner med quizens spørsmål",
    )
    if todo:
        await knowledge_store.save_question_embeddings(
            ctx.services.pool,
            ctx.workspace_id,
            quiz_id,
            settings.model,
            [
                NewEmbedding(q.question_id, content_hash(q.text), v)
                for q, v in zip(todo, got.vectors[1:], strict=True)
            ],
        )
    fresh = {q.question_id: v for q, v in zip(todo, got.vectors[1:], strict=True)}
    vectors = {q.question_id: fresh.get(q.question_id) or q.embedding or [] for q in questions}
    return got.vectors[0], vectors, asdict(got.usage)


def ranked(vector: list[float], vectors: dict[str, list[float]]) -> list[tuple[str, float]]:
    scored = [(qid, cosine(vector, v)) for qid, v in vectors.items()]
    return sorted(((qid, s) for qid, s in scored if s is not None), key=lambda t: -t[1])


async def run(ctx: JobContext, payload: ModerationPayload) -> dict[str, Any]:
    raw = await ctx.workspace_settings()
    threshold = valgomat_settings(raw).duplicate_threshold
    emb = embedding_settings(raw)
    ai = resolve_settings(raw, TASK)
    guard = call_guard(raw, (DEFAULT_MODEL, DEFAULT_EMBEDDING_MODEL))
    guard.allow_model(emb.model)
    guard.allow_model(ai.model)
    gateway = AiGateway.from_services(ctx.services, guard)
    vector, vectors, embed_usage = await question_vectors(
        ctx, gateway, emb, payload.quiz_id, payload.question
    )
    # A cosine in Python per question: 1,000 questions of 3,072 numbers held the event loop,
    # and every job on it, for a second; in a thread the loop takes its turns between them.
    best = await asyncio.to_thread(ranked, vector, vectors)
    duplicate = best[0] if best and best[0][1] >= threshold else None
    await ctx.progress("Omformulerer nøytralt…", 85)
    review = await gateway.structured(
        ai.model,
        [system_message(ai.prompt, ai.names), {"role": "user", "content": payload.question}],
        Review,
    )
    duplicate_of = duplicate[0] if duplicate else None
    similarity = round(best[0][1], 4) if best else None
    result = {
        "review": review.value.model_dump(mode="json"),
        "duplicate_of": duplicate_of,
        "similarity": similarity,
        "similar": [
            {"question_id": q, "similarity": round(s, 4)} for q, s in best[:SHOWN_CANDIDATES]
        ],
        "threshold": threshold,
        "model": ai.model,
        "embedding_model": emb.model,
        "usage": {"chat": asdict(review.usage), "embeddings": embed_usage},
    }
    ref = payload.submission_ref or f"job:{ctx.job_id}"
    row_id, status = await knowledge_store.save_moderation(
        ctx.services.pool,
        ctx.workspace_id,
        payload.quiz_id,
        ref,
        payload.question,
        duplicate_of,
        similarity,
        review.value.neutral_question,
        review.value.flags,
        result,
        ai.model,
        ctx.job_id,
    )
    return {**result, "moderation_id": str(row_id), "submission_ref": ref, "status": status}


JOB_TYPE = JobType(
    name="valgomat_moderation",
    handler=run,
    payload_model=ModerationPayload,
    default_priority=default_priority("valgomat_moderation"),
    timeout_s=600,
    description="a user's quiz question -> duplicate check and neutral rewrite for a moderator "
    "{quiz_id, question, submission_ref?}",
    needs_settings=("AI_GATEWAY_URL", "AI_GATEWAY_KEY"),
)
