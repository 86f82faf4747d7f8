"""The AI gateway's failure modes as OpenRouter documents them, through a real worker: each error
class, Retry-After, the cluster-wide 429 pause, schema mismatches, secrets, embeddings."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from uuid import UUID

import asyncpg
import httpx
import pytest

from sidelinja_worker.queue import client
from sidelinja_worker.queue.config import Secret, ServiceConfig
from sidelinja_worker.queue.errors import PermanentError, RetryJob
from sidelinja_worker.queue.limits import RateLimiter
from sidelinja_worker.services import ai_gateway as gateway_module
from sidelinja_worker.services.ai_gateway import AiGateway
from tests.fakes.ai_gateway_server import (  # noqa: F401
    FakeAiGateway,
    Reply,
    ai_gateway_fixture,
    completion,
    error,
    error_in_choice,
)
from tests.helpers import run_burst
from tests.test_ai_jobs import gateway_config, job

CLIP = {"text": "Regjeringen lyser ut nye felt for havvind."}


async def one_clip(
    pool: asyncpg.Pool,
    db_url: str,
    workspace: UUID,
    gw: FakeAiGateway,
    config: ServiceConfig | None = None,
) -> asyncpg.Record:
    job_id = await client.enqueue(pool, workspace, "research_clip", CLIP)
    await run_burst(pool, db_url, config=config or gateway_config(gw))
    return await job(pool, job_id)


def seconds_from_now(when: datetime) -> float:
    return (when - datetime.now(UTC)).total_seconds()


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (error(400, "model is required"), "AI gateway 400: model is required"),
        (
            error(402, "Insufficient credits", {"limit_source": "key"}),
            "AI gateway 402: Insufficient credits (limit_source: key)",
        ),
        (
            error(
                403,
                "Input was flagged",
                {"reasons": ["harassment"], "provider_name": "OpenAI", "flagged_input": "..."},
            ),
            "AI gateway 403: Input was flagged (reasons: harassment; provider_name: OpenAI)",
        ),
        (
            error_in_choice(400, "context length exceeded"),
            "AI gateway 400: context length exceeded",
        ),
    ],
)
async def test_permanent_errors_fail_at_once_with_the_gateway_message(
    pool: asyncpg.Pool,
    db_url: str,
    workspace: UUID,
    ai_gateway: FakeAiGateway,
    reply: Reply,
    expected: str,
) -> None:
    ai_gateway.push(reply)
    row = await one_clip(pool, db_url, workspace, ai_gateway)
    assert (row["status"], row["attempts"], row["error_msg"]) == ("error", 1, expected)
    assert len(ai_gateway.requests) == 1


async def test_a_wrong_key_is_a_permanent_401(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, ai_gateway: FakeAiGateway
) -> None:
    config = ServiceConfig({"AI_GATEWAY_URL": ai_gateway.url, "AI_GATEWAY_KEY": "sk-or-v1-wrong"})
    row = await one_clip(pool, db_url, workspace, ai_gateway, config)
    assert (row["status"], row["error_msg"]) == (
        "error",
        "AI gateway 401: No auth credentials found",
    )


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (
            error(502, "Provider returned error", {"provider_name": "Together", "raw": "upstream"}),
            "AI gateway 502: Provider returned error (provider_name: Together)",
        ),
        (error(408, "Request timed out"), "AI gateway 408: Request timed out"),
        (error_in_choice(502, "Provider disconnected"), "AI gateway 502: Provider disconnected"),
        (
            Reply(502, "<html><body>Bad Gateway</body></html>"),
            "AI gateway 502: <html><body>Bad Gateway</body></html>",
        ),
    ],
)
async def test_transient_errors_retry_with_backoff(
    pool: asyncpg.Pool,
    db_url: str,
    workspace: UUID,
    ai_gateway: FakeAiGateway,
    reply: Reply,
    expected: str,
) -> None:
    ai_gateway.push(reply)
    row = await one_clip(pool, db_url, workspace, ai_gateway)
    assert (row["status"], row["attempts"], row["error_msg"]) == ("retry", 1, expected)
    assert 20 < seconds_from_now(row["scheduled_for"]) <= 30  # the seed's first backoff


@pytest.mark.parametrize("retry_after", ["1e9", "-5", "nan"])
async def test_a_429_whose_retry_after_is_no_delay_pauses_nobody_and_backs_off(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, ai_gateway: FakeAiGateway, retry_after: str
) -> None:
    """Retry-After is read as every service's is: an unsigned decimal or a date. Before, the
    gateway's own reading took any number float() reads: "1e9" paused every worker's calls
    for the hour it was believed up to, and "-5" retried the job at once, an attempt gone."""
    ai_gateway.push(error(429, "Rate limit exceeded", retry_after=retry_after))
    row = await one_clip(pool, db_url, workspace, ai_gateway)
    assert (row["status"], row["attempts"]) == ("retry", 1)
    assert 20 < seconds_from_now(row["scheduled_for"]) <= 30  # the seed's first backoff
    assert await pool.fetchval("SELECT count(*) FROM rate_limits") == 0


async def test_a_503_honours_retry_after(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, ai_gateway: FakeAiGateway
) -> None:
    ai_gateway.push(error(503, "No allowed providers are available", retry_after="120"))
    row = await one_clip(pool, db_url, workspace, ai_gateway)
    assert row["status"] == "retry"
    assert 110 < seconds_from_now(row["scheduled_for"]) <= 120
    assert await pool.fetchval("SELECT count(*) FROM rate_limits") == 0  # only a 429 pauses all


async def test_a_slow_gateway_times_out_and_retries(
    pool: asyncpg.Pool,
    db_url: str,
    workspace: UUID,
    ai_gateway: FakeAiGateway,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(gateway_module, "CHAT_TIMEOUT_S", 0.3)
    ai_gateway.push(Reply(200, {}, delay_s=10))
    row = await one_clip(pool, db_url, workspace, ai_gateway)
    assert (row["status"], row["error_msg"]) == ("retry", "AI gateway did not answer within 0.3 s")


async def test_an_unreachable_gateway_retries(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, ai_gateway: FakeAiGateway
) -> None:
    ai_gateway.stop()
    row = await one_clip(pool, db_url, workspace, ai_gateway)
    assert (row["status"], row["error_msg"]) == ("retry", "AI gateway unreachable (ConnectError)")


async def test_a_429_pauses_the_gateway_for_every_worker(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, ai_gateway: FakeAiGateway
) -> None:
    ai_gateway.push(error(429, "Rate limit exceeded: free-models-per-min", retry_after="30"))
    first = await one_clip(pool, db_url, workspace, ai_gateway)
    assert (first["status"], first["error_msg"]) == (
        "retry",
        "AI gateway 429: Rate limit exceeded: free-models-per-min",
    )
    assert 20 < seconds_from_now(first["scheduled_for"]) <= 30
    paused_until = await pool.fetchval(
        "SELECT paused_until FROM rate_limits WHERE key = 'ai_gateway'"
    )
    assert 20 < seconds_from_now(paused_until) <= 30

    # Another worker (a new process's view of the limits) does not call the gateway meanwhile:
    # its job is deferred, not failed, until the pause ends.
    second = await one_clip(pool, db_url, workspace, ai_gateway)
    assert (second["status"], second["attempts"], second["error_msg"]) == ("pending", 0, None)
    assert 20 < seconds_from_now(second["scheduled_for"]) <= 31
    assert len(ai_gateway.requests) == 1


async def test_a_non_schema_answer_is_asked_again_once_with_the_error(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, ai_gateway: FakeAiGateway
) -> None:
    ai_gateway.push(completion({"headline": "Havvind"}))
    row = await one_clip(pool, db_url, workspace, ai_gateway)
    assert row["status"] == "completed", row["error_msg"]
    first, again = ai_gateway.chat_requests()
    messages = again.body["messages"]
    assert messages[:2] == first.body["messages"]
    assert messages[2] == {"role": "assistant", "content": '{"headline": "Havvind"}'}
    assert messages[3]["role"] == "user"
    assert "did not match the required JSON schema: title: Field required" in messages[3]["content"]
    assert row["result"]["usage"]["calls"] == 2


async def test_two_non_schema_answers_fail_the_job(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, ai_gateway: FakeAiGateway
) -> None:
    ai_gateway.push(
        completion("Beklager, jeg kan ikke svare i JSON."), completion('{"title": "Havvind"')
    )  # cut off (finish_reason length)
    row = await one_clip(pool, db_url, workspace, ai_gateway)
    assert (row["status"], row["attempts"]) == ("error", 1)
    assert row["error_msg"].startswith("the model's answer did not match the Clip schema twice:")
    assert "Invalid JSON" in row["error_msg"]
    assert len(ai_gateway.requests) == 2


async def test_the_key_never_reaches_errors_results_or_logs(
    pool: asyncpg.Pool,
    db_url: str,
    workspace: UUID,
    ai_gateway: FakeAiGateway,
    caplog: pytest.LogCaptureFixture,
) -> None:
    key = ai_gateway.key
    echo = f"upstream rejected Authorization: Bearer {key}"
    ai_gateway.push(error(400, echo, {"provider_name": key}), error(502, echo))
    caplog.set_level(logging.DEBUG)
    failed = await one_clip(pool, db_url, workspace, ai_gateway)
    retried = await one_clip(pool, db_url, workspace, ai_gateway)
    done = await one_clip(pool, db_url, workspace, ai_gateway)
    assert failed["error_msg"] == (
        "AI gateway 400: upstream rejected Authorization: Bearer *** (provider_name: ***)"
    )
    assert retried["status"] == "retry" and key not in retried["error_msg"]
    assert done["status"] == "completed"
    everything = await pool.fetchval("SELECT string_agg(j::text, ' ') FROM job_queue j")
    everything += await pool.fetchval("SELECT string_agg(a::text, ' ') FROM ai_results a")
    assert "Bearer ***" in everything and key not in everything
    assert caplog.records and key not in caplog.text
    assert all(key not in str(r.args) for r in caplog.records)


@pytest.fixture
async def gateway(pool: asyncpg.Pool, ai_gateway: FakeAiGateway) -> AsyncIterator[AiGateway]:
    async with httpx.AsyncClient() as http:
        yield AiGateway(http, ai_gateway.url, Secret(ai_gateway.key), RateLimiter(pool))


async def test_embeddings_come_back_in_input_order(
    gateway: AiGateway, ai_gateway: FakeAiGateway
) -> None:
    got = await gateway.embeddings(
        "openai/text-embedding-3-small", ["havvind", "byvalg", "Tromsø"], dimensions=4
    )
    again = await gateway.embeddings("openai/text-embedding-3-small", ["Tromsø"], dimensions=4)
    assert len(got.vectors) == 3 and all(len(v) == 4 for v in got.vectors)
    assert got.vectors[2] == again.vectors[0]  # the server answers out of order
    assert (got.model, got.usage.prompt_tokens) == ("openai/text-embedding-3-small", 9)
    body = ai_gateway.requests[0].body
    assert body == {
        "model": "openai/text-embedding-3-small",
        "input": ["havvind", "byvalg", "Tromsø"],
        "encoding_format": "float",
        "dimensions": 4,
    }


async def test_embedding_errors_are_classified(
    gateway: AiGateway, ai_gateway: FakeAiGateway
) -> None:
    ai_gateway.push(error(400, "input must not be empty"), error(503, "busy", retry_after="5"))
    with pytest.raises(PermanentError, match="AI gateway 400: input must not be empty"):
        await gateway.embeddings("m", [""])
    with pytest.raises(RetryJob, match="AI gateway 503: busy") as info:
        await gateway.embeddings("m", ["x"])
    assert info.value.after_s == 5.0
