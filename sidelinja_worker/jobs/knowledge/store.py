"""One typed async function per named query in sql/knowledge.sql: embeddings and similarity
search, the election quiz and the prompt lab, always inside one workspace."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple
from uuid import UUID

import asyncpg

from sidelinja_worker.queue.db import Conn
from sidelinja_worker.queue.errors import PermanentError
from sidelinja_worker.queue.queries import load

Q = load("sidelinja_worker.jobs.knowledge")
INDEXED_DIMS = 1536  # the dimension knowledge_embeddings_hnsw_1536 covers (migration 0010)


@dataclass(frozen=True)
class StoredHash:
    content_sha256: bytes
    dims: int


@dataclass(frozen=True)
class NewEmbedding:
    ref: str
    content_sha256: bytes
    vector: list[float]


@dataclass(frozen=True)
class Similar:
    ref: str
    similarity: float


@dataclass(frozen=True)
class QuizQuestion:
    question_id: str
    text: str
    embedding_model: str | None
    embedding_sha256: bytes | None
    embedding: list[float] | None


@dataclass(frozen=True)
class EvalRow:
    model: str
    case_id: str
    passed: bool
    output: str | None
    error: str | None
    scores: list[dict[str, Any]]
    latency_ms: int | None
    prompt_tokens: int
    completion_tokens: int


def vector_literal(vector: Sequence[float]) -> str:
    """pgvector's text form; passed as text and cast in SQL, so no client-side type codec."""
    return "[" + ",".join(repr(float(x)) for x in vector) + "]"


async def pgvector_ready(conn: Conn) -> bool:
    """Whether migration 0010 could create knowledge_embeddings (pgvector was available)."""
    return bool(await conn.fetchval(Q["pgvector_ready"]))


# The most text of one node an embeddings job reads (as much as a whole job payload carries;
# an embedding model reads a few thousand tokens), and of all the nodes it names together.
MAX_NODE_TEXT_BYTES = 4 * 1024 * 1024
MAX_NODE_TEXTS_BYTES = 64 * 1024 * 1024


class NodeTexts(NamedTuple):
    texts: dict[str, str]  # node id -> its text, for every node found, when none is over a cap
    too_big: dict[str, int]  # node id -> its size in bytes, for those over MAX_NODE_TEXT_BYTES
    total: int  # the bytes of every node found, together


async def node_texts(conn: Conn, workspace_id: UUID, node_ids: Sequence[str]) -> NodeTexts:
    """The nodes' texts, none read past the caps: a node over MAX_NODE_TEXT_BYTES is named in
    `too_big`, and with one, or a total over MAX_NODE_TEXTS_BYTES, `texts` is empty."""
    rows = await conn.fetch(
        Q["node_texts"], workspace_id, list(node_ids), MAX_NODE_TEXT_BYTES, MAX_NODE_TEXTS_BYTES
    )
    too_big = {r["node_id"]: r["size"] for r in rows if r["size"] > MAX_NODE_TEXT_BYTES}
    total = rows[0]["total"] if rows else 0
    if too_big or total > MAX_NODE_TEXTS_BYTES:
        return NodeTexts({}, too_big, total)
    return NodeTexts({r["node_id"]: r["content"] for r in rows}, {}, total)


async def embedding_state(
    conn: Conn, workspace_id: UUID, model: str, refs: Sequence[str]
) -> dict[str, StoredHash]:
    rows = await conn.fetch(Q["embedding_state"], workspace_id, model, list(refs))
    return {r["ref"]: StoredHash(bytes(r["content_sha256"]), r["dims"]) for r in rows}


async def save_embeddings(
    pool: asyncpg.Pool, workspace_id: UUID, model: str, job_id: UUID, items: Sequence[NewEmbedding]
) -> None:
    """Upserts one batch in one transaction: a retry after a crash skips the saved batches.
    Its vectors are written out in a thread: a batch of 2,048 vectors of 3,072 numbers is 6
    million floats, seconds of the event loop."""
    literals = await asyncio.to_thread(lambda: [vector_literal(e.vector) for e in items])
    args = [
        (workspace_id, e.ref, model, len(e.vector), e.content_sha256, literal, job_id)
        for e, literal in zip(items, literals, strict=True)
    ]
    async with pool.acquire() as conn, conn.transaction():
        await conn.executemany(Q["save_embedding"], args)


async def similar(
    pool: asyncpg.Pool, workspace_id: UUID, model: str, vector: Sequence[float], limit: int = 10
) -> list[Similar]:
    """The `limit` stored embeddings of this workspace and model closest to `vector` by cosine
    similarity, best first. 1536 dimensions go through the HNSW index, with an iterative scan so
    the workspace/model filter cannot leave the answer short; others are searched exactly."""
    literal = vector_literal(vector)
    async with pool.acquire() as conn, conn.transaction():
        if len(vector) == INDEXED_DIMS:
            await conn.execute(Q["exact_hnsw_scan"])
            rows = await conn.fetch(Q["similar_1536"], workspace_id, model, literal, limit)
        else:
            rows = await conn.fetch(
                Q["similar_any"], workspace_id, model, literal, limit, len(vector)
            )
    return [Similar(r["ref"], float(r["similarity"])) for r in rows]


async def save_profile(
    conn: Conn,
    workspace_id: UUID,
    quiz_id: str,
    party: str,
    job_id: UUID,
    model: str,
    profile: dict[str, Any],
) -> UUID:
    return await conn.fetchval(
        Q["save_profile"], workspace_id, quiz_id, party, job_id, model, profile
    )


# A quiz's questions a moderation compares a submission with (a quiz has tens), and the most
# text of one question or its id; past either, the job fails rather than read it.
MAX_QUIZ_QUESTIONS = 1000
MAX_QUESTION_BYTES = 64 * 1024


async def quiz_questions(conn: Conn, workspace_id: UUID, quiz_id: str) -> list[QuizQuestion]:
    """The quiz's questions, none read past the caps: a quiz of more than MAX_QUIZ_QUESTIONS,
    or a question (text or id) of more than MAX_QUESTION_BYTES, is a PermanentError."""
    rows = await conn.fetch(
        Q["quiz_questions"], workspace_id, quiz_id, MAX_QUIZ_QUESTIONS, MAX_QUESTION_BYTES
    )
    if rows and rows[0]["questions"] > MAX_QUIZ_QUESTIONS:
        raise PermanentError(
            f"quiz {quiz_id!r} has {rows[0]['questions']:,} questions, over the"
            f" {MAX_QUIZ_QUESTIONS:,} a moderation compares with"
        )
    too_big = next((r for r in rows if r["text"] is None), None)
    if too_big is not None:
        raise PermanentError(
            f"a question of quiz {quiz_id!r} ({too_big['question_id'][:100]!r}) is"
            f" {too_big['size']:,} bytes, over the {MAX_QUESTION_BYTES:,} a question may be"
        )
    return [
        QuizQuestion(
            r["question_id"],
            r["text"],
            r["embedding_model"],
            bytes(r["embedding_sha256"]) if r["embedding_sha256"] is not None else None,
            list(r["embedding"]) if r["embedding"] is not None else None,
        )
        for r in rows
    ]


async def save_question_embeddings(
    pool: asyncpg.Pool, workspace_id: UUID, quiz_id: str, model: str, items: Sequence[NewEmbedding]
) -> None:
    args = [(workspace_id, quiz_id, e.ref, model, e.content_sha256, e.vector) for e in items]
    async with pool.acquire() as conn, conn.transaction():
        await conn.executemany(Q["save_question_embedding"], args)


async def save_moderation(
    conn: Conn,
    workspace_id: UUID,
    quiz_id: str,
    submission_ref: str,
    question: str,
    duplicate_of: str | None,
    similarity: float | None,
    rewrite: str,
    flags: Sequence[str],
    result: dict[str, Any],
    model: str,
    job_id: UUID,
) -> tuple[UUID, str]:
    """The review's id and status; a review a moderator already decided is left as it was."""
    row_id = await conn.fetchval(
        Q["save_moderation"],
        workspace_id,
        quiz_id,
        submission_ref,
        question,
        duplicate_of,
        similarity,
        rewrite,
        list(flags),
        result,
        model,
        job_id,
    )
    if row_id is not None:
        return row_id, "pending"
    row = await conn.fetchrow(Q["moderation_status"], workspace_id, quiz_id, submission_ref)
    return row["id"], row["status"]


async def save_eval_run(
    pool: asyncpg.Pool,
    workspace_id: UUID,
    run_ref: str,
    job_id: UUID,
    prompt: str,
    models: Sequence[str],
    summary: dict[str, Any],
    rows: Sequence[EvalRow],
) -> UUID:
    """The run, its summary and every case's result, replacing an earlier run of the same ref,
    in one transaction."""
    async with pool.acquire() as conn, conn.transaction():
        run_id = await conn.fetchval(
            Q["save_eval_run"], workspace_id, run_ref, job_id, prompt, list(models), summary
        )
        await conn.execute(Q["clear_eval_results"], run_id, workspace_id)
        await conn.executemany(
            Q["save_eval_result"],
            [
                (
                    run_id,
                    workspace_id,
                    r.model,
                    r.case_id,
                    r.passed,
                    r.output,
                    r.error,
                    r.scores,
                    r.latency_ms,
                    r.prompt_tokens,
                    r.completion_tokens,
                )
                for r in rows
            ],
        )
    return run_id
