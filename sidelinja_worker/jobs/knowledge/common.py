"""What the embedding-based job types share (generate_embeddings, valgomat_moderation): the
workspace's embedding settings, content hashes, batched calls and cosine similarity.

Workspace settings read (all optional; `workspaces.settings`):
    ai.embeddings.model        embedding model (default DEFAULT_EMBEDDING_MODEL)
    ai.embeddings.batch_size   inputs per embeddings request (default DEFAULT_BATCH_SIZE)
    ai.embeddings.dimensions   ask the model for this many dimensions (models that support it)
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sidelinja_worker.queue.context import JobContext
from sidelinja_worker.queue.errors import PermanentError
from sidelinja_worker.queue.registry import describe_validation_error
from sidelinja_worker.services.ai_answers import Usage
from sidelinja_worker.services.ai_gateway import AiGateway

# OpenAI's small embedding model through OpenRouter: 1536 dimensions, the HNSW-indexed size.
DEFAULT_EMBEDDING_MODEL = "openai/text-embedding-3-small"
# OpenAI accepts up to 2048 inputs per request; 64 keeps one request's body and time small.
DEFAULT_BATCH_SIZE = 64


class EmbeddingSettings(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    model: str = Field(default=DEFAULT_EMBEDDING_MODEL, min_length=1)
    batch_size: int = Field(default=DEFAULT_BATCH_SIZE, ge=1, le=2048)
    dimensions: int | None = Field(default=None, ge=1, le=16_000)


@dataclass(frozen=True)
class Embedded:
    vectors: list[list[float]]
    usage: Usage


def embedding_settings(settings: Mapping[str, Any]) -> EmbeddingSettings:
    raw = (settings.get("ai") or {}).get("embeddings") or {}
    try:
        return EmbeddingSettings.model_validate(raw)
    except ValidationError as exc:
        raise PermanentError(
            f"workspace settings ai.embeddings: {describe_validation_error(exc)}"
        ) from None


def content_hash(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8")).digest()


def batches(items: Sequence[Any], size: int) -> list[Sequence[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


async def embed_batch(
    gateway: AiGateway, model: str, texts: Sequence[str], dimensions: int | None
) -> Embedded:
    """One embeddings request; vectors that disagree in size with each other or with
    `dimensions` fail the job (the model ignores the setting: a retry would not help)."""
    got = await gateway.embeddings(model, texts, dimensions=dimensions)
    sizes = {len(v) for v in got.vectors}
    if len(sizes) > 1 or 0 in sizes:
        raise PermanentError(f"embedding model {model} returned vectors of sizes {sorted(sizes)}")
    if dimensions is not None and sizes != {dimensions}:
        raise PermanentError(
            f"embedding model {model} returned {sizes.pop()} dimensions, "
            f"not the {dimensions} asked for"
        )
    return Embedded(got.vectors, got.usage)


async def embed_all(
    ctx: JobContext,
    gateway: AiGateway,
    settings: EmbeddingSettings,
    texts: Sequence[str],
    label: str,
) -> Embedded:
    """Every text's vector, in order, `settings.batch_size` per request, reporting progress."""
    vectors: list[list[float]] = []
    usage = Usage()
    chunks = batches(texts, settings.batch_size)
    for i, chunk in enumerate(chunks, 1):
        await ctx.progress(f"{label} ({i}/{len(chunks)})…", 10 + 70 * (i - 1) / len(chunks))
        got = await embed_batch(gateway, settings.model, chunk, settings.dimensions)
        vectors.extend(got.vectors)
        usage += got.usage
    return Embedded(vectors, usage)


def cosine(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Cosine similarity; None for vectors of different sizes or a zero vector."""
    if len(a) != len(b):
        return None
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    if norm == 0:
        return None
    return sum(x * y for x, y in zip(a, b, strict=True)) / norm
