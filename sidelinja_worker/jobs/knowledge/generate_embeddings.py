"""`generate_embeddings`: knowledge-graph nodes (by id) or texts -> vectors in the workspace's
pgvector table, skipping texts whose content and model are unchanged; and `search`, the
similarity search over them."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any
from uuid import UUID

import asyncpg
from pydantic import BaseModel, ConfigDict, Field, model_validator

from sidelinja_worker.jobs.knowledge import store as knowledge_store
from sidelinja_worker.jobs.knowledge.common import (
    DEFAULT_EMBEDDING_MODEL,
    EmbeddingSettings,
    batches,
    content_hash,
    embed_batch,
    embedding_settings,
)
from sidelinja_worker.jobs.knowledge.store import NewEmbedding, Similar
from sidelinja_worker.jobs.silos import call_guard, check_planned_calls
from sidelinja_worker.queue.context import JobContext
from sidelinja_worker.queue.errors import PermanentError
from sidelinja_worker.queue.priorities import default_priority
from sidelinja_worker.queue.registry import JobType
from sidelinja_worker.services.ai_answers import Usage
from sidelinja_worker.services.ai_gateway import AiGateway

MAX_ITEMS = 10_000
NO_PGVECTOR = (
    "generate_embeddings needs the pgvector extension, which this database server "
    "does not have (knowledge_embeddings was not created by migration 0010); use a "
    "PostgreSQL with pgvector, e.g. the embedded one"
)


class TextItem(BaseModel):
    model_config = ConfigDict(frozen=True)

    ref: str = Field(min_length=1, max_length=500)
    text: str = Field(min_length=1)


class EmbeddingsPayload(BaseModel):
    """Nodes of `knowledge_nodes` by id, or texts with the caller's refs. Exactly one."""

    model_config = ConfigDict(frozen=True)

    node_ids: list[str] | None = Field(default=None, min_length=1, max_length=MAX_ITEMS)
    items: list[TextItem] | None = Field(default=None, min_length=1, max_length=MAX_ITEMS)
    model: str | None = Field(default=None, min_length=1)
    dimensions: int | None = Field(default=None, ge=1, le=16_000)

    @model_validator(mode="after")
    def _one_source(self) -> EmbeddingsPayload:
        if (self.node_ids is None) == (self.items is None):
            raise ValueError("give exactly one of node_ids or items")
        refs = self.node_ids if self.node_ids is not None else [i.ref for i in self.items or []]
        if len(set(refs)) != len(refs):
            raise ValueError("node ids / refs must be unique")
        return self


def job_settings(payload: EmbeddingsPayload, raw: dict[str, Any]) -> EmbeddingSettings:
    ws = embedding_settings(raw)
    return ws.model_copy(
        update={
            "model": payload.model or ws.model,
            "dimensions": payload.dimensions or ws.dimensions,
        }
    )


async def texts_of(ctx: JobContext, payload: EmbeddingsPayload) -> dict[str, str]:
    """ref -> text; node ids are looked up in this workspace only (never another's)."""
    if payload.items is not None:
        return {item.ref: item.text for item in payload.items}
    assert payload.node_ids is not None
    nodes = await knowledge_store.node_texts(ctx.services.pool, ctx.workspace_id, payload.node_ids)
    if nodes.too_big:
        shown = ", ".join(f"{n!r} ({size:,} bytes)" for n, size in list(nodes.too_big.items())[:5])
        raise PermanentError(
            f"{len(nodes.too_big)} node(s) over {knowledge_store.MAX_NODE_TEXT_BYTES:,} bytes of"
            f" text, more than an embedding reads: {shown}"
        )
    if nodes.total > knowledge_store.MAX_NODE_TEXTS_BYTES:
        raise PermanentError(
            f"the nodes hold {nodes.total:,} bytes of text together, over the"
            f" {knowledge_store.MAX_NODE_TEXTS_BYTES:,} one job reads: split them among jobs"
        )
    found = nodes.texts
    missing = [n for n in payload.node_ids if n not in found]
    if missing:
        shown = ", ".join(repr(n) for n in missing[:5])
        raise PermanentError(f"{len(missing)} node(s) not found in this workspace: {shown}")
    return {n: found[n] for n in payload.node_ids}


def unchanged(
    stored: knowledge_store.StoredHash | None, digest: bytes, dimensions: int | None
) -> bool:
    return (
        stored is not None
        and stored.content_sha256 == digest
        and (dimensions is None or stored.dims == dimensions)
    )


async def run(ctx: JobContext, payload: EmbeddingsPayload) -> dict[str, Any]:
    pool = ctx.services.pool
    if not await knowledge_store.pgvector_ready(pool):
        raise PermanentError(NO_PGVECTOR)
    settings = job_settings(payload, await ctx.workspace_settings())
    texts = await texts_of(ctx, payload)
    empty = [ref for ref, text in texts.items() if not text.strip()]
    digests = {ref: content_hash(text) for ref, text in texts.items() if text.strip()}
    state = await knowledge_store.embedding_state(
        pool, ctx.workspace_id, settings.model, list(digests)
    )
    todo = [
        ref for ref, d in digests.items() if not unchanged(state.get(ref), d, settings.dimensions)
    ]
    guard = call_guard(await ctx.workspace_settings(), (DEFAULT_EMBEDDING_MODEL,))
    guard.allow_model(settings.model)
    gateway = AiGateway.from_services(ctx.services, guard)
    usage = Usage()
    chunks = batches(todo, settings.batch_size)
    check_planned_calls(
        guard, len(chunks), f"{len(todo)} texts in batches of {settings.batch_size}"
    )
    for i, chunk in enumerate(chunks, 1):
        await ctx.progress(f"Lager embeddings ({i}/{len(chunks)})…", 5 + 90 * (i - 1) / len(chunks))
        got = await embed_batch(
            gateway, settings.model, [texts[r] for r in chunk], settings.dimensions
        )
        await knowledge_store.save_embeddings(
            pool,
            ctx.workspace_id,
            settings.model,
            ctx.job_id,
            [
                NewEmbedding(ref, digests[ref], vec)
                for ref, vec in zip(chunk, got.vectors, strict=True)
            ],
        )
        usage += got.usage
    return {
        "model": settings.model,
        "embedded": len(todo),
        "unchanged": len(digests) - len(todo),
        "empty": empty,
        "requests": len(chunks),
        "usage": asdict(usage),
    }


async def search(
    pool: asyncpg.Pool,
    gateway: AiGateway,
    workspace_id: UUID,
    query: str,
    *,
    model: str,
    dimensions: int | None = None,
    limit: int = 10,
) -> list[Similar]:
    """The workspace's stored texts closest in meaning to `query` (embedded with the same model
    the texts were), best first."""
    if not await knowledge_store.pgvector_ready(pool):
        raise PermanentError(NO_PGVECTOR)
    got = await embed_batch(gateway, model, [query], dimensions)
    return await knowledge_store.similar(pool, workspace_id, model, got.vectors[0], limit)


JOB_TYPE = JobType(
    name="generate_embeddings",
    handler=run,
    payload_model=EmbeddingsPayload,
    default_priority=default_priority("generate_embeddings"),
    timeout_s=1800,
    description="knowledge-graph nodes or texts -> pgvector embeddings "
    "{node_ids | items: [{ref, text}], model?, dimensions?}",
    needs_settings=("AI_GATEWAY_URL", "AI_GATEWAY_KEY"),
)
