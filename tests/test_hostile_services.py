"""Hostile outside services: every service client against a server that answers as an attacker
(or a broken proxy) would. Each case asserts the documented outcome: the error class (a
RetryJob for what may heal, a PermanentError for what will not) and its message.

Documented outcomes (services/bounded.py and each client):
- a body over the service's size cap, declared or found while reading: PermanentError naming
  the limit; the client stops reading.
- a body dripped so slowly that the whole answer overruns the deadline: RetryJob.
- a redirect, to another host or not: PermanentError naming the host; never followed.
- a body that is not JSON (malformed, invalid UTF-8) where JSON is due: RetryJob.
- JSON of the wrong shape: RetryJob (Forgejo's write, LiveKit) or PermanentError naming what
  is missing (Forgejo's file without a sha).
- NUL characters in a model's answer are removed (PostgreSQL cannot store them); an SRT from
  whisper that is not UTF-8 is a PermanentError.
- an absurd header value: an unreadable Content-Length is a protocol error (RetryJob); a
  Retry-After of nan, inf or years is ignored or capped at an hour.
- a compressed body (asked for uncompressed): one layer of gzip or deflate is read, inflated a
  piece at a time, its limit counted in inflated bytes; another encoding, or a body that is not
  what its encoding says, is a PermanentError naming it. A bomb costs neither memory nor a
  long step of the event loop."""

from __future__ import annotations

import asyncio
import functools
import threading
import time
import zlib
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import httpx
import orjson
import pytest
import zstandard
from pydantic import BaseModel

from sidelinja_worker.queue.config import Secret
from sidelinja_worker.queue.errors import PermanentError, RetryJob
from sidelinja_worker.queue.limits import RateLimiter
from sidelinja_worker.services import ai_answers, ai_errors, bounded, classify, livekit, whisper
from sidelinja_worker.services import ai_gateway as gateway_module
from sidelinja_worker.services.ai_answers import Usage
from sidelinja_worker.services.ai_gateway import AiGateway
from sidelinja_worker.services.forgejo import Forgejo, RepoFile
from tests.fakes.hostile_server import Answer, HostileServer, hostile_server, json_answer
from tests.fakes.stalls import longest_gap, longest_stall, peak_memory

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hei"}]}


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=httpx.Timeout(5.0)) as client:
        yield client


@pytest.fixture
async def server() -> AsyncIterator[HostileServer]:
    async with hostile_server() as fake:
        yield fake


def gateway(http: httpx.AsyncClient, url: str, pool: asyncpg.Pool) -> AiGateway:
    return AiGateway(http, url, Secret("key-SECRET"), RateLimiter(pool))


async def transcribe(http: httpx.AsyncClient, url: str, audio: Path) -> str:
    """whisper's client sending `audio`, opened here as its job opens it and closed after."""
    with audio.open("rb") as f:
        return await whisper.transcribe_srt(
            http, whisper.WhisperServer(url), whisper.TranscribeRequest(f, "m", "no")
        )


async def test_a_redirect_to_another_host_is_refused_and_not_followed(
    http: httpx.AsyncClient, pool: asyncpg.Pool, server: HostileServer, tmp_path: Path
) -> None:
    async with hostile_server(json_answer(b'{"choices": []}')) as elsewhere:
        where = elsewhere.url.replace("127.0.0.1", "localhost") + "/steal"
        server.answer = Answer(302, [("Location", where)])
        expected = (
            "answered 302, a redirect to host 'localhost'; redirects are not followed: "
            "configure the service's final URL"
        )
        with pytest.raises(PermanentError) as caught:
            await gateway(http, server.url, pool).chat(CHAT)
        assert str(caught.value) == f"AI gateway {expected}"
        with pytest.raises(PermanentError) as caught:
            await Forgejo(http, server.url, Secret("t")).read(RepoFile("o", "r", "a.srt"))
        assert str(caught.value) == f"Forgejo {expected}"
        with pytest.raises(PermanentError) as caught:
            await livekit.list_rooms(http, livekit.LiveKitServer(server.url, "k", Secret("s" * 40)))
        assert str(caught.value) == f"LiveKit {expected}"
        audio = tmp_path / "a.wav"
        audio.write_bytes(b"RIFF" + b"\x00" * 100)
        with pytest.raises(PermanentError) as caught:
            await transcribe(http, server.url, audio)
        assert str(caught.value) == f"whisper {expected}"
        assert elsewhere.requests == []  # never contacted


async def test_a_declared_enormous_body_is_refused_unread(
    http: httpx.AsyncClient, pool: asyncpg.Pool, server: HostileServer
) -> None:
    server.answer = json_answer(b"{}", content_length=str(10**12))
    with pytest.raises(PermanentError) as caught:
        await gateway(http, server.url, pool).chat(CHAT)
    assert str(caught.value) == (
        "AI gateway's answer declares 1000000000000 bytes, over the limit of 16777216 bytes"
    )


async def test_an_undeclared_endless_body_is_cut_at_the_limit(
    http: httpx.AsyncClient,
    pool: asyncpg.Pool,
    server: HostileServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(gateway_module, "MAX_CHAT_BYTES", 1 << 20)
    server.answer = json_answer(b'{"a": 1}', content_length="", stream_bytes=50 << 20)
    with pytest.raises(PermanentError) as caught:
        await gateway(http, server.url, pool).chat(CHAT)
    assert str(caught.value) == "AI gateway's answer goes on, over the limit of 1048576 bytes"


async def test_a_dripped_answer_overruns_the_deadline_and_retries(
    http: httpx.AsyncClient,
    pool: asyncpg.Pool,
    server: HostileServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(gateway_module, "CHAT_TIMEOUT_S", 0.4)
    monkeypatch.setattr(gateway_module, "CONNECT_TIMEOUT_S", 0.2)
    # Each byte well inside the read timeout; the whole answer far outside the deadline.
    server.answer = json_answer(b'{"choices": []}' + b" " * 100, drip_s=0.05)
    with pytest.raises(RetryJob) as caught:
        await gateway(http, server.url, pool).chat(CHAT)
    assert str(caught.value) == "AI gateway did not answer within 0.6 s"


@pytest.mark.parametrize(
    "body",
    [
        b'{"choices": [',  # malformed
        b'{"choices": [{"message": {"content": "\xff\xfe"}}]}',  # invalid UTF-8
        b"<html>\x00\x00</html>",  # a proxy's page, with NUL bytes
        b"[" * 100_000,  # nested past the parser's recursion limit
    ],
)
async def test_a_body_that_is_not_json_retries(
    http: httpx.AsyncClient, pool: asyncpg.Pool, server: HostileServer, body: bytes
) -> None:
    server.answer = json_answer(body)
    with pytest.raises(RetryJob) as caught:
        await gateway(http, server.url, pool).chat(CHAT)
    assert str(caught.value) == "AI gateway answered with a body that is not JSON"


async def test_nul_characters_are_removed_from_a_models_answer(
    http: httpx.AsyncClient, pool: asyncpg.Pool, server: HostileServer
) -> None:
    server.answer = json_answer(b'{"choices": [{"message": {"content": "O\\u0000slo\\u0000"}}]}')
    content, _ = await gateway(http, server.url, pool).chat(CHAT)
    assert content == "Oslo"


@pytest.mark.parametrize("length", ["-5", "abc", "1, 2"])
async def test_an_unreadable_content_length_is_a_protocol_error_that_retries(
    http: httpx.AsyncClient, pool: asyncpg.Pool, server: HostileServer, length: str
) -> None:
    server.answer = json_answer(b"{}", content_length=length)
    with pytest.raises(RetryJob) as caught:
        await gateway(http, server.url, pool).chat(CHAT)
    assert str(caught.value) == "AI gateway unreachable (RemoteProtocolError)"


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("nan", None),
        ("inf", None),
        ("-inf", None),
        ("1e308", None),  # an exponent, as for every service (an hour's pause of all before)
        ("99999999999999999999", 3600.0),
        ("-30", None),  # a sign (0 before: retried at once)
        ("Fri, 31 Dec 9999 23:59:59 GMT", 3600.0),
        ("Mon, 99 Foo 2025", None),
        ("\x00", None),
    ],
)
def test_absurd_retry_after_values_are_ignored_or_capped(value: str, seconds: float | None) -> None:
    answer = httpx.Response(429)
    answer.headers["Retry-After"] = value
    assert ai_errors.retry_after_s(answer) == seconds


async def test_a_429_with_an_infinite_retry_after_retries_without_a_pause(
    http: httpx.AsyncClient, pool: asyncpg.Pool, server: HostileServer
) -> None:
    server.answer = Answer(
        429,
        [("Content-Type", "application/json"), ("Retry-After", "inf")],
        b'{"error": {"code": 429, "message": "slow down"}}',
    )
    with pytest.raises(RetryJob) as caught:
        await gateway(http, server.url, pool).chat(CHAT)
    assert (str(caught.value), caught.value.after_s) == ("AI gateway 429: slow down", None)
    assert await pool.fetchval("SELECT count(*) FROM rate_limits WHERE paused_until > now()") == 0


async def test_forgejo_answers_of_the_wrong_shape(
    http: httpx.AsyncClient, server: HostileServer
) -> None:
    forgejo = Forgejo(http, server.url, Secret("t"))
    file = RepoFile("o", "r", "a.srt")
    server.answer = json_answer(b'{"type": "file", "encoding": "base64", "content": "aGk="}')
    with pytest.raises(PermanentError, match="^Forgejo: a.srt came without its sha$"):
        await forgejo.read(file)
    server.answer = json_answer(b"[1, 2")
    with pytest.raises(RetryJob, match="^Forgejo answered 200 with a body that is not JSON$"):
        await forgejo.read(file)
    for content in (b"[1, 2]", b"5", rb'"\u00e6"'):  # base64 is an ASCII string, nothing else
        server.answer = json_answer(
            b'{"type": "file", "encoding": "base64", "sha": "s", "content": ' + content + b"}"
        )
        with pytest.raises(PermanentError, match="^Forgejo: a.srt has content that is not base64$"):
            await forgejo.read(file)
    server.answer = json_answer(b"{}", content_length=str(1 << 40))
    with pytest.raises(PermanentError, match="declares 1099511627776 bytes, over the limit"):
        await forgejo.read(file)


async def test_a_whisper_srt_that_is_not_utf8_is_refused(
    http: httpx.AsyncClient, server: HostileServer, tmp_path: Path
) -> None:
    audio = tmp_path / "a.wav"
    audio.write_bytes(b"RIFF" + b"\x00" * 100)
    server.answer = Answer(200, [("Content-Type", "text/plain")], b"1\n00:00:01,000 --> \xff\n")
    with pytest.raises(PermanentError) as caught:
        await transcribe(http, server.url, audio)
    assert str(caught.value) == "whisper answered 200 with bytes that are not UTF-8 (byte 19)"


@pytest.mark.parametrize(
    "body",
    [
        b"{",
        b'{"rooms": [{"num_participants": "many"}]}',
        b'{"rooms": [{"num_participants": 1e999}]}',
        b'{"rooms": 5}',
        b"[]",
        b"[" * 100_000,
    ],
)
async def test_a_livekit_room_list_that_cannot_be_read_retries(
    http: httpx.AsyncClient, server: HostileServer, body: bytes
) -> None:
    livekit.clear_cache()
    server.answer = json_answer(body)
    with pytest.raises(RetryJob) as caught:
        await livekit.list_rooms(http, livekit.LiveKitServer(server.url, "k", Secret("s" * 40)))
    assert str(caught.value) == "LiveKit answered 200 with a room list that cannot be read"


async def test_a_big_body_is_read_off_the_event_loop() -> None:
    def thread(body: bytes, fail: bool = False) -> str:
        if fail:
            raise ValueError("not JSON")
        return threading.current_thread().name

    here = threading.current_thread().name
    assert await bounded.off_loop(thread, b" " * (bounded.OFF_LOOP_JSON_BYTES - 1)) == here
    assert await bounded.off_loop(thread, b" " * bounded.OFF_LOOP_JSON_BYTES) != here
    with pytest.raises(ValueError, match="not JSON"):
        await bounded.off_loop(thread, b" " * bounded.OFF_LOOP_JSON_BYTES, fail=True)


@pytest.mark.parametrize(
    "embedding",
    [
        b"[0.5, NaN]",
        b"[0.5, Infinity]",
        b"[0.5, -1e999]",
        b'[0.5, "nan"]',
        b"[0.5, true]",
        b'"0.5"',
    ],
)
async def test_an_embedding_that_is_not_finite_numbers_retries(
    http: httpx.AsyncClient, pool: asyncpg.Pool, server: HostileServer, embedding: bytes
) -> None:
    # Stored, such a vector is never asked for again (its text is unchanged): NaN made every
    # later similarity with it NaN, and a quiz's duplicate check missed the real duplicate.
    server.answer = json_answer(
        b'{"data": [{"index": 0, "embedding": [0.5, 0.5]}, {"index": 1, "embedding": '
        + embedding
        + b"}]}"
    )
    with pytest.raises(RetryJob) as caught:
        await gateway(http, server.url, pool).embeddings("m", ["a", "b"])
    assert str(caught.value) == "AI gateway returned an embedding that is not a list of numbers"


async def test_an_embeddings_answer_bigger_than_the_vectors_asked_for_is_refused_unread(
    http: httpx.AsyncClient, pool: asyncpg.Pool, server: HostileServer
) -> None:
    # Two vectors of 1,536 numbers may take 214 kB: an answer of 20 MB, far under the 160 MB
    # any embeddings answer may hold, is refused before a byte of it is parsed (a parse holds
    # the GIL, in a thread too, and with it every job's event loop).
    asked = gateway_module.embeddings_answer_bytes(2, 1536)
    vector = b"[" + b", ".join([b"0.012345678901234567"] * 1536) + b"]"
    padding = b" " * (20 * 1024 * 1024)
    items = b", ".join(b'{"index": %d, "embedding": %s}' % (i, vector) for i in range(2))
    server.answer = json_answer(b'{"data": [' + items + b"]" + padding + b"}")
    with pytest.raises(PermanentError) as caught:
        await gateway(http, server.url, pool).embeddings("m", ["a", "b"], dimensions=1536)
    assert str(caught.value) == (
        f"AI gateway's answer declares {len(server.answer.body)} bytes, over the limit of {asked} bytes"
    )
    server.answer = json_answer(b'{"data": [' + items + b"]}")
    got = await gateway(http, server.url, pool).embeddings("m", ["a", "b"], dimensions=1536)
    assert [len(v) for v in got.vectors] == [1536, 1536]
    # Without `dimensions`, as many numbers as pgvector stores; never past the overall cap.
    assert gateway_module.embeddings_answer_bytes(64, None) == 64 * 1024 + 64 * (1024 + 16_000 * 48)
    assert gateway_module.embeddings_answer_bytes(2048, 3072) == gateway_module.MAX_EMBED_BYTES


@pytest.mark.parametrize("dimensions, numbers", [(None, 16_000), (4, 4)])
async def test_an_embedding_of_more_numbers_than_asked_for_is_refused_unread(
    http: httpx.AsyncClient,
    pool: asyncpg.Pool,
    server: HostileServer,
    dimensions: int | None,
    numbers: int,
) -> None:
    # The byte cap assumes 48 bytes a number: in 2-byte numbers ("0,") the answer of a default
    # batch held 24.6 million, a gigabyte of floats, all of them accepted without `dimensions`.
    # Here two inputs fill their cap with 2-byte numbers; the first vector is refused before
    # msgspec builds it. A vector of as many numbers as may be stored is read.
    limit = gateway_module.embeddings_answer_bytes(2, dimensions)
    count = (limit - 1024) // 4
    vector = b"[" + b"0," * (count - 1) + b"0]"
    items = b", ".join(b'{"index": %d, "embedding": %s}' % (i, vector) for i in range(2))
    server.answer = json_answer(b'{"data": [' + items + b"]}")
    assert len(server.answer.body) <= limit
    with peak_memory() as peak, pytest.raises(PermanentError) as caught:
        await gateway(http, server.url, pool).embeddings("m", ["a", "b"], dimensions=dimensions)
    figures = (str(caught.value), peak[0] < 50_000_000)
    assert figures == (f"AI gateway returned an embedding of more than {numbers} numbers", True)
    vector = b"[" + b"0.5," * (numbers - 1) + b"0.5]"
    items = b", ".join(b'{"index": %d, "embedding": %s}' % (i, vector) for i in range(2))
    server.answer = json_answer(b'{"data": [' + items + b"]}")
    got = await gateway(http, server.url, pool).embeddings("m", ["a", "b"], dimensions=dimensions)
    assert [len(v) for v in got.vectors] == [numbers, numbers]


@pytest.mark.parametrize("data", [b"[null, null]", b'[{"index": "0"}, {"index": 1}]', b'"ab"'])
async def test_an_embeddings_list_of_the_wrong_shape_retries(
    http: httpx.AsyncClient, pool: asyncpg.Pool, server: HostileServer, data: bytes
) -> None:
    server.answer = json_answer(b'{"data": ' + data + b"}")
    with pytest.raises(RetryJob) as caught:
        await gateway(http, server.url, pool).embeddings("m", ["a", "b"])
    assert str(caught.value) == "AI gateway answered with an embeddings list that cannot be read"


@pytest.mark.parametrize("indexes", [(0, 1, 0, 1), (9, 7, 8, 6), (0, 1, 2, 2), (1, 2, 3, 4)])
async def test_embedding_indexes_that_are_not_each_input_once_retry(
    http: httpx.AsyncClient, pool: asyncpg.Pool, server: HostileServer, indexes: tuple[int, ...]
) -> None:
    # Indexes numbered per sub-batch (0, 1, 0, 1) were sorted and stored against the wrong
    # texts, each row with its own text's hash, so never embedded again.
    items = b", ".join(b'{"index": %d, "embedding": [%d]}' % (i, n) for n, i in enumerate(indexes))
    server.answer = json_answer(b'{"data": [' + items + b"]}")
    with pytest.raises(RetryJob) as caught:
        await gateway(http, server.url, pool).embeddings("m", ["a", "b", "c", "d"])
    assert str(caught.value) == (
        "AI gateway returned embedding indexes that are not each of the 4 inputs once"
    )
    items = b", ".join(b'{"index": %d, "embedding": [%d]}' % (i, i) for i in (2, 0, 3, 1))
    server.answer = json_answer(b'{"data": [' + items + b"]}")
    got = await gateway(http, server.url, pool).embeddings("m", ["a", "b", "c", "d"])
    assert got.vectors == [[0.0], [1.0], [2.0], [3.0]]


async def test_an_error_body_nested_past_the_parsers_limit_keeps_the_statuss_outcome(
    http: httpx.AsyncClient, pool: asyncpg.Pool, server: HostileServer, tmp_path: Path
) -> None:
    deep = b'{"error": ' * 100_000
    server.answer = json_answer(deep, status=401)
    audio = tmp_path / "a.wav"
    audio.write_bytes(b"RIFF" + b"\x00" * 100)
    with pytest.raises(PermanentError, match="^whisper refused the API key"):
        await transcribe(http, server.url, audio)
    with pytest.raises(PermanentError, match="^Forgejo refused the token"):
        await Forgejo(http, server.url, Secret("t")).read(RepoFile("o", "r", "a.srt"))
    with pytest.raises(PermanentError, match="^AI gateway 401: "):
        await gateway(http, server.url, pool).chat(CHAT)


@pytest.mark.parametrize(
    "usage",
    [
        b"[1]",
        b'{"prompt_tokens": 1e999, "completion_tokens": 20}',
        b'{"prompt_tokens": "many", "completion_tokens": 20}',
        b'{"prompt_tokens": 3000000000, "completion_tokens": 20}',  # past an INTEGER column
        b'{"prompt_tokens": -5, "completion_tokens": 20.0}',
        b'{"prompt_tokens": true, "completion_tokens": 20}',
    ],
)
async def test_token_counts_that_cannot_be_true_read_as_unknown(
    http: httpx.AsyncClient, pool: asyncpg.Pool, server: HostileServer, usage: bytes
) -> None:
    # The call is made and paid for: a count it reports never fails the job that made it.
    server.answer = json_answer(
        b'{"choices": [{"message": {"content": "Oslo"}}], "usage": ' + usage + b"}"
    )
    content, got = await gateway(http, server.url, pool).chat(CHAT)
    assert content == "Oslo"
    assert (got.prompt_tokens, got.calls) == (0, 1)
    assert got.completion_tokens == (0 if usage == b"[1]" else 20)


LIMIT = 1 << 20  # a service's cap on its answer, decoded
INFLATED = 512 << 20  # what each bomb below inflates to
ZEROS = bytes(1 << 24)


def gzip(pieces: list[bytes], level: int = 9) -> bytes:
    pack = zlib.compressobj(level, zlib.DEFLATED, 31)
    return b"".join([pack.compress(p) for p in pieces] + [pack.flush()])


@functools.cache
def bomb(encoding: str) -> bytes:
    """A body that inflates a thousandfold (gzip: 65 kB of 64 MB) or more: 6 kB of gzip in
    gzip and 16 kB of zstd inflate to INFLATED bytes (a 64 kB read of zstd to 2 GB)."""
    if encoding == "gzip":
        return gzip([ZEROS] * 4)
    if encoding == "gzip, gzip":
        return gzip([gzip([ZEROS] * (INFLATED // len(ZEROS)), level=1)])
    pack = zstandard.ZstdCompressor().compressobj()
    return b"".join([pack.compress(ZEROS) for _ in range(INFLATED // len(ZEROS))] + [pack.flush()])


NOT_READ = (
    "S answered with Content-Encoding {!r}, which is not read here (the request asks for identity)"
)


@pytest.mark.parametrize(
    ("encoding", "outcome"),
    [
        ("gzip", "S's answer goes on, over the limit of 1048576 bytes"),
        ("gzip, gzip", NOT_READ.format("gzip, gzip")),
        ("zstd", NOT_READ.format("zstd")),
    ],
)
async def test_a_compressed_bomb_costs_neither_memory_nor_a_long_step(
    http: httpx.AsyncClient, server: HostileServer, encoding: str, outcome: str
) -> None:
    # httpx inflated each network read whole, before the size was checked: 1,827 bytes of
    # gzip in gzip became 2 GB in one step of 6.6 s, 33 kB of zstd 2 GB in 1.8 s.
    await http.get(server.url)  # the first request imports httpx's network backend: not timed
    headers = [("Content-Type", "application/json"), ("Content-Encoding", encoding)]
    server.answer = Answer(200, headers, bomb(encoding), content_length="")  # its size unknown
    with peak_memory() as peak, longest_stall() as longest:
        await asyncio.sleep(0)  # a new step, timed: this one started before the block
        with pytest.raises(PermanentError) as caught:
            await bounded.send(http, "GET", server.url, service="S", max_bytes=LIMIT, deadline_s=60)
        await asyncio.sleep(0)  # the step that raised ends inside the block
    figures = (str(caught.value), peak[0] < 16 * LIMIT, longest[0] < 0.25)
    assert figures == (outcome, True, True), (peak, longest)


def deflate(data: bytes, wbits: int) -> bytes:
    pack = zlib.compressobj(6, zlib.DEFLATED, wbits)
    return pack.compress(data) + pack.flush()


BODY = b'{"rooms": [' + b", ".join([b'{"name": "studio", "num_participants": 2}'] * 5000) + b"]}"


@pytest.mark.parametrize(
    ("encoding", "body"),
    [
        ("gzip", deflate(BODY, 31)),
        ("x-gzip", deflate(BODY, 31)),
        ("deflate", deflate(BODY, 15)),  # with zlib's header, as the RFC says
        ("deflate", deflate(BODY, -15)),  # without, as some servers send it
        # gzip members one after another are one text (only the first was read, unnoticed).
        ("gzip", deflate(BODY[:70_000], 31) + deflate(b"", 31) + deflate(BODY[70_000:], 31)),
        ("identity", BODY),
        ("", BODY),
    ],
)
async def test_a_compressed_answer_within_its_limit_is_read_whole(
    http: httpx.AsyncClient, server: HostileServer, encoding: str, body: bytes
) -> None:
    server.answer = Answer(200, [("Content-Encoding", encoding)], body)
    response = await bounded.send(
        http, "GET", server.url, service="S", max_bytes=len(BODY), deadline_s=60
    )
    assert response.content == BODY
    assert "content-encoding" not in response.headers  # it describes no byte we keep
    assert b"\r\naccept-encoding: identity\r\n" in server.requests[0].lower()


@pytest.mark.parametrize(
    ("encoding", "body", "outcome"),
    [
        ("gzip", deflate(BODY, 31)[:-100], "cannot be decoded: the compressed stream ends early"),
        ("gzip", b"\x1f\x8b\x09" + bytes(100), "cannot be decoded: Error -3 .*unknown compression"),
        ("deflate", b"\xff" * 100, "cannot be decoded: Error -3 .*invalid block type"),
        ("gzip", deflate(BODY, 31), "goes on, over the limit of 215010 bytes"),
        ("gzip", deflate(BODY[:9], 31) + deflate(BODY, 31), "goes on, over the limit of 215010"),
        (
            "gzip",
            deflate(BODY[:9], 31) + deflate(BODY[:50], 31)[:-9],
            "the compressed stream ends early",
        ),
        ("gzip", deflate(BODY[:9], 31) + b"\x1f", "the compressed stream ends early"),
        (
            "gzip",
            deflate(BODY[:9], 31) + b"GARBAGE",
            "the body goes on after its compressed stream",
        ),
        (
            "gzip",
            deflate(BODY[:9], 31) + b"\x00" * 8,
            "the body goes on after its compressed stream",
        ),
        ("deflate", deflate(BODY[:9], 15) * 2, "the body goes on after its compressed stream"),
        ("br", BODY, "Content-Encoding 'br', which is not read here"),
        ("compress", BODY, "Content-Encoding 'compress', which is not read here"),
    ],
)
async def test_a_compressed_answer_that_cannot_be_read_within_its_limit_is_refused(
    http: httpx.AsyncClient, server: HostileServer, encoding: str, body: bytes, outcome: str
) -> None:
    server.answer = Answer(200, [("Content-Encoding", encoding)], body, content_length="")
    with pytest.raises(PermanentError, match=outcome):
        await bounded.send(
            http, "GET", server.url, service="S", max_bytes=len(BODY) - 1, deadline_s=60
        )


def test_gzip_members_split_anywhere_are_read_as_one_text() -> None:
    # A network read may end inside a member's header, or between its two magic bytes.
    body = deflate(BODY[:100], 31) + deflate(BODY[100:], 31)
    inflater = bounded._Inflater("gzip")
    read = b"".join(piece for i in range(len(body)) for piece in inflater.pieces(body[i : i + 1]))
    inflater.finish()
    assert read == BODY


async def test_an_empty_answer_said_to_be_compressed_is_empty(
    http: httpx.AsyncClient, server: HostileServer
) -> None:
    server.answer = Answer(204, [("Content-Encoding", "gzip")])
    response = await bounded.send(http, "GET", server.url, service="S", max_bytes=10, deadline_s=60)
    assert (response.status_code, response.content) == (204, b"")


async def test_a_body_of_one_byte_chunks_costs_neither_memory_nor_a_long_step(
    http: httpx.AsyncClient, server: HostileServer
) -> None:
    # Each chunk of a chunked body came as a bytes object of its own, kept in a list until the
    # end (some 100 bytes for each byte of the answer), and a 64 kB read of one-byte chunks was
    # 10,000 of them parsed in one step of the event loop.
    body = 1 << 19
    await http.get(server.url)  # the first request imports httpx's network backend: not timed
    chunked = [("Transfer-Encoding", "chunked")]
    server.answer = Answer(200, chunked, b"1\r\nx\r\n" * body + b"0\r\n\r\n", content_length="")
    with peak_memory() as peak, longest_stall() as longest:
        await asyncio.sleep(0)  # a new step, timed: this one started before the block
        response = await bounded.send(
            http, "GET", server.url, service="S", max_bytes=body, deadline_s=120
        )
        await asyncio.sleep(0)  # the step that got the answer ends inside the block
    figures = (response.content == b"x" * body, peak[0] < 8 * body, longest[0] < 0.25)
    assert figures == (True, True, True), (peak, longest)


async def error_from_each_service(
    http: httpx.AsyncClient, pool: asyncpg.Pool, url: str, audio: Path
) -> list[Exception]:
    """What each client makes of the answer `url` gives, in the order whisper, Forgejo,
    LiveKit, AI gateway."""
    livekit.clear_cache()
    calls = [
        transcribe(http, url, audio),
        Forgejo(http, url, Secret("t")).read(RepoFile("o", "r", "a.srt")),
        livekit.list_rooms(http, livekit.LiveKitServer(url, "k", Secret("s" * 40))),
        gateway(http, url, pool).chat(CHAT),
    ]
    errors: list[Exception] = []
    for call in calls:
        try:
            await call
        except Exception as exc:  # whatever it is: the test looks at what each one raised
            errors.append(exc)
    return errors


SERVICES = ["whisper", "Forgejo", "LiveKit", "AI gateway"]


@pytest.mark.parametrize("charset", ["punycode", "idna", "zlib"])
async def test_an_error_body_is_read_as_utf8_whatever_charset_it_names(
    http: httpx.AsyncClient, pool: asyncpg.Pool, server: HostileServer, tmp_path: Path, charset: str
) -> None:
    # httpx decodes a body's text with any codec Python has, named by the answer's
    # Content-Type: punycode's decoder is quadratic (160 kB took 1.4 s, on the event loop),
    # idna's refuses to replace what it cannot read and zlib's returns bytes (an unexpected
    # error instead of the status's outcome).
    audio = tmp_path / "a.wav"
    audio.write_bytes(b"RIFF" + b"\x00" * 100)
    await http.get(server.url)  # the first request imports httpx's network backend: not timed
    body = b"a" * 80_000 + b"-" + b"b" * 80_000
    server.answer = Answer(500, [("Content-Type", f"text/plain; charset={charset}")], body)
    with longest_stall() as longest:
        await asyncio.sleep(0)  # a new step, timed: this one started before the block
        errors = await error_from_each_service(http, pool, server.url, audio)
        await asyncio.sleep(0)
    assert (longest[0] < 0.3, [type(e) for e in errors]) == (True, [RetryJob] * 4), longest
    assert [str(e) for e in errors] == [
        *(f"{name} answered 500: {'a' * 300}" for name in SERVICES[:3]),
        f"AI gateway 500: {'a' * 200}",
    ]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            b'{"message": "boom", "pad": [' + b"[]," * 1_300_000 + b"[]]}",
            '{"message": "boom", "pad"',
        ),
        (b"boom" + b" ab" * 1_300_000, "boom ab ab ab ab ab ab ab"),
    ],
)
async def test_a_huge_error_body_is_read_no_further_than_its_start(
    http: httpx.AsyncClient,
    pool: asyncpg.Pool,
    server: HostileServer,
    tmp_path: Path,
    body: bytes,
    message: str,
) -> None:
    # A service's error message was found in all of its body, up to the answer's limit (32 MB
    # from Forgejo), on the event loop: 4 MB of empty JSON lists parsed, or 4 MB of words split
    # into 1.3 million strings, to show 300 characters.
    audio = tmp_path / "a.wav"
    audio.write_bytes(b"RIFF" + b"\x00" * 100)
    await http.get(server.url)  # the first request imports httpx's network backend: not timed
    server.answer = Answer(500, [("Content-Type", "application/json")], body)
    with peak_memory() as peak, longest_stall() as longest:
        await asyncio.sleep(0)  # a new step, timed: this one started before the block
        errors = await error_from_each_service(http, pool, server.url, audio)
        await asyncio.sleep(0)
    # Before: steps of 0.09-0.30 s and 105-129 MB; now none over 20 ms and 16-25 MB (the body is
    # held by the server and, a copy or two at a time, by each client).
    figures = (longest[0] < 0.25, peak[0] < 16 * len(body), [type(e) for e in errors])
    assert figures == (True, True, [RetryJob] * 4), (longest, peak)
    assert [str(e)[: len(message) + 22] for e in errors[:3]] == [
        f"{name} answered 500: {message}" for name in SERVICES[:3]
    ]


async def test_a_livekit_list_of_a_million_rooms_is_read_off_the_event_loop(
    http: httpx.AsyncClient, server: HostileServer
) -> None:
    # 1.39 million empty rooms fit in 4 MB; each was made a Room on the event loop: 1.0 s.
    livekit.clear_cache()
    await http.get(server.url)  # the first request imports httpx's network backend: not timed
    last = b'{"name": "studio", "num_participants": 2}'
    server.answer = json_answer(b'{"rooms": [' + b"{}," * 1_390_000 + last + b"]}")
    with longest_stall() as longest:
        await asyncio.sleep(0)  # a new step, timed: this one started before the block
        rooms = await livekit.list_rooms(
            http, livekit.LiveKitServer(server.url, "k", Secret("s" * 40))
        )
        await asyncio.sleep(0)  # the step that got the rooms ends inside the block
    # The parse itself, in a thread, still holds the GIL 0.1 s (json.loads is one call).
    figures = (len(rooms), rooms[-1], longest[0] < 0.3)
    assert figures == (1_390_001, livekit.Room("studio", 2), True), longest


async def test_an_embeddings_list_of_millions_of_items_is_refused_before_it_is_built(
    http: httpx.AsyncClient, pool: asyncpg.Pool, server: HostileServer
) -> None:
    # An answer for 16 inputs of unknown dimensions may hold 12 MB: 4.1 million empty items.
    # Each was checked and sorted on the event loop before their number was compared with the
    # inputs'; then, in a thread, each became an object before the list's length was compared:
    # ~250 MB, and 0.26 s of the GIL. The decoder now expects 16 items and stops at the 17th.
    # The last one is no item at all: a list looked at before it is counted is one that "cannot
    # be read", found at its end.
    count = (gateway_module.embeddings_answer_bytes(16, None) - 100) // 3
    await http.get(server.url)  # the first request imports httpx's network backend: not timed
    server.answer = json_answer(b'{"data": [' + b"{}," * (count - 1) + b"null]}")
    with peak_memory() as peak, longest_stall() as longest:
        await asyncio.sleep(0)  # a new step, timed: this one started before the block
        with pytest.raises(RetryJob) as caught:
            await gateway(http, server.url, pool).embeddings("m", ["a"] * 16)
        await asyncio.sleep(0)  # the step that raised ends inside the block
    figures = (str(caught.value), longest[0] < 1.0, peak[0] < 100_000_000)
    assert figures == (
        "AI gateway returned a list that is not one embedding for each of the 16 inputs",
        True,
        True,
    ), (longest, peak)


@pytest.mark.parametrize(
    "data, message",
    [
        (b"[" + b",".join([b'{"embedding": [0.5]}'] * 3) + b"]", "returned 3 embeddings for 16"),
        (b"[" + b"{}," * 20 + b"{}]", "returned 21 embeddings for 16"),
        (b"null", "returned 0 embeddings for 16"),
        (b'{"0": []}', "an embeddings list that cannot be read"),
    ],
)
def test_an_embeddings_list_of_the_wrong_length_is_counted_when_small(
    data: bytes, message: str
) -> None:
    with pytest.raises(RetryJob, match=message):
        ai_answers.embeddings_answer(b'{"data": ' + data + b"}", 16, 1536)


async def test_a_model_name_that_is_not_a_string_is_the_model_asked_for(
    http: httpx.AsyncClient, pool: asyncpg.Pool, server: HostileServer
) -> None:
    # The answer's model was made a string whatever it was: 4 million empty lists, written out
    # on the event loop (0.21 s), became a model name of 16 MB.
    items = b", ".join(b'{"index": %d, "embedding": [0.5]}' % i for i in range(16))
    model = b"[" + b"[]," * 4_000_000 + b"[]]"
    server.answer = json_answer(b'{"data": [' + items + b'], "model": ' + model + b"}")
    got = await gateway(http, server.url, pool).embeddings("m", ["a"] * 16)
    assert (got.model, len(got.vectors)) == ("m", 16)
    server.answer = json_answer(b'{"data": [' + items + b'], "model": "m-2024"}')
    got = await gateway(http, server.url, pool).embeddings("m", ["a"] * 16)
    assert got.model == "m-2024"


@pytest.mark.parametrize(
    "error",
    [
        {"code": 500, "message": [[] for _ in range(5_000_000)]},
        {"code": 500, "message": "boom", "metadata": {"reasons": [[] for _ in range(5_000_000)]}},
        {"code": 500, "message": "x" * 16_000_000},
    ],
)
def test_an_error_of_any_size_is_described_without_being_written_out_whole(
    error: dict[str, object],
) -> None:
    # A 200 answer may hold 16 MB, and an error in it was written out whole as text, on the
    # event loop, to be cut to a message of 400 characters: 5 million empty lists took 0.2-0.3 s.
    # Timed alone: the answer's parse, in a thread, holds the GIL and would blur a loop's step.
    started = time.perf_counter()
    text = ai_errors.describe_error(500, error)
    took = time.perf_counter() - started
    figures = (text[:16], len(text) <= ai_errors.MAX_MESSAGE_CHARS, took < 0.1)
    assert figures == ("AI gateway 500: ", True, True), took


async def test_a_forgejo_file_beside_millions_of_other_values_is_read_without_building_them(
    http: httpx.AsyncClient, server: HostileServer
) -> None:
    # A file's answer may hold 32 MB. Parsed whole, in a thread that holds the GIL throughout
    # (json.loads is one call), 30 MB of empty lists beside the file's fields held every job's
    # event loop 1.9 s and took 870 MB; a file of 28 MB, 0.09 s and 160 MB.
    fields = b'"type": "file", "encoding": "base64", "content": "aGk=", "sha": "s"'
    body = b"{" + fields + b', "pad": [' + b"[]," * 10_000_000 + b"[]]}"
    await http.get(server.url)  # the first request imports httpx's network backend: not timed
    server.answer = json_answer(body)
    with peak_memory() as peak:
        async with longest_gap() as gap:
            state = await Forgejo(http, server.url, Secret("t")).read(RepoFile("o", "r", "a.srt"))
    figures = (state.content, state.sha, gap[0] < 0.5, peak[0] < 400_000_000)
    assert figures == (b"hi", "s", True, True), (gap, peak)


class Items(BaseModel):
    items: list[str]


async def test_an_answer_of_countless_schema_errors_is_described_by_their_count(
    http: httpx.AsyncClient, pool: asyncpg.Pool, server: HostileServer
) -> None:
    # Listing a ValidationError's first five errors built every one of them, in one call that
    # holds the GIL: an answer of 200,000 wrong items held every job's event loop 2.1 s, once
    # for the answer and once for the answer asked again. Here 131,000, validated in 0.1 s.
    messages = [{"role": "user", "content": "hei"}]
    count = (gateway_module.answer_limit_chars(messages) - 20) // 2
    content = '{"items": [' + "1," * (count - 1) + "1]}"
    answer = {"choices": [{"message": {"content": content}}]}
    server.answer = json_answer(orjson.dumps(answer))
    await http.get(server.url)  # the first request imports httpx's network backend: not timed
    async with longest_gap() as gap:
        with pytest.raises(PermanentError) as caught:
            await gateway(http, server.url, pool).structured("m", messages, Items)
    figures = (str(caught.value), gap[0] < 0.3)
    assert figures == (
        "the model's answer did not match the Items schema twice:"
        f" {count} validation errors for Items, too many to list",
        True,
    ), gap
    # A few errors are listed, the first five of them.
    server.answer = json_answer(
        orjson.dumps({"choices": [{"message": {"content": '{"items": [1, 2, 3, 4, 5, 6]}'}}]})
    )
    with pytest.raises(PermanentError, match=r"items\.0: Input should be a valid string; items\.1"):
        await gateway(http, server.url, pool).structured("m", messages, Items)


def _distinct_keys(count: int) -> bytes:
    return b"{" + b",".join(b'"k%d":0' % i for i in range(count)) + b"}"


@pytest.mark.parametrize(
    "pad",
    [
        pytest.param(b'"pad": [' + b"[]," * 5_500_000 + b"[]]", id="empty-lists"),
        pytest.param(b'"pad": ' + _distinct_keys(1_200_000), id="distinct-keys"),
        pytest.param(b'"choices": [' + b"[]," * 5_500_000 + b"[]]", id="more-choices"),
    ],
)
async def test_a_chat_answer_beside_millions_of_other_values_is_read_without_building_them(
    http: httpx.AsyncClient, pool: asyncpg.Pool, server: HostileServer, pad: bytes
) -> None:
    # A chat answer may hold 16 MB. Parsed whole, in a thread that holds the GIL throughout
    # (json.loads is one call), millions of empty lists or distinct keys in a field nobody reads
    # held every job's event loop 1.4-1.9 s and took some 400 MB; a real answer of 16 MB, 0.1 s.
    # More choices than the first are skipped as well: only the first is read.
    first = b'"choices": [{"message": {"content": "Oslo"}, "finish_reason": "stop"}'
    if pad.startswith(b'"choices"'):
        body = b"{" + first + b"," + pad[len(b'"choices": [') :] + b', "usage": {}}'
    else:
        body = b"{" + first + b"], " + pad + b', "usage": {"prompt_tokens": 7}}'
    assert len(body) < gateway_module.MAX_CHAT_BYTES
    await http.get(server.url)  # the first request imports httpx's network backend: not timed
    server.answer = json_answer(body)
    with peak_memory() as peak:
        async with longest_gap() as gap:
            content, usage = await gateway(http, server.url, pool).chat(CHAT)
    tokens = 0 if pad.startswith(b'"choices"') else 7
    figures = (content, usage.prompt_tokens, gap[0] < 0.4, peak[0] < 80_000_000)
    assert figures == ("Oslo", tokens, True, True), (gap, peak)


@pytest.mark.parametrize(
    ("body", "outcome"),
    [
        # msgspec refuses a lone surrogate escape anywhere in a body; json read it, and so still.
        (rb'{"choices": [{"message": {"content": "hei"}}], "x": "\udc00\\ud800"}', "hei"),
        (
            rb'{"choices": [{"message": {"content": "a\ud83d\ude00b\\ud800\udc00"}}]}',
            "a😀b\\ud800?",
        ),
        # Choices after the first are skipped, whatever they are.
        (b'{"choices": [{"message": {"content": "hei"}}, 1, [], {"error": 1}]}', "hei"),
        (b'{"choices": [{"message": {"content": 7}}], "usage": {"prompt_tokens": 1e999}}', None),
        (b'{"choices": [[], {"message": {"content": "hei"}}]}', RetryJob),
        (b'{"choices": {"message": {"content": "hei"}}}', RetryJob),
        (b'{"choices": []}', RetryJob),
    ],
)
async def test_a_chat_answer_is_read_field_by_field(
    http: httpx.AsyncClient,
    pool: asyncpg.Pool,
    server: HostileServer,
    body: bytes,
    outcome: str | type[Exception] | None,
) -> None:
    server.answer = json_answer(body)
    if outcome is RetryJob:
        with pytest.raises(RetryJob, match="^AI gateway answered without choices$"):
            await gateway(http, server.url, pool).chat(CHAT)
        return
    content, usage = await gateway(http, server.url, pool).chat(CHAT)
    assert (content, usage) == (outcome, Usage(0, 0, 1))


async def test_an_error_in_a_chat_answer_is_described_without_building_its_values(
    http: httpx.AsyncClient, pool: asyncpg.Pool, server: HostileServer
) -> None:
    reasons = b"[" + b"[]," * 4_000_000 + b"[]]"
    error = b'{"code": 503, "message": "down", "metadata": {"reasons": ' + reasons + b"}}"
    await http.get(server.url)  # the first request imports httpx's network backend: not timed
    server.answer = json_answer(
        b'{"choices": [{"finish_reason": "error", "error": ' + error + b"}]}"
    )
    with peak_memory() as peak, pytest.raises(RetryJob) as caught:
        await gateway(http, server.url, pool).chat(CHAT)
    figures = (str(caught.value)[:50], peak[0] < 100_000_000)
    assert figures == ("AI gateway 503: down (reasons: [[],[],[],[],[],[],", True), peak


@pytest.mark.parametrize(
    "pad",
    [
        pytest.param(b'"pad": [' + b"[]," * 3_500_000 + b"[]]", id="empty-lists"),
        pytest.param(b'"pad": ' + _distinct_keys(800_000), id="distinct-keys"),
    ],
)
async def test_an_embeddings_answer_beside_millions_of_other_values_is_read_without_building_them(
    http: httpx.AsyncClient, pool: asyncpg.Pool, server: HostileServer, pad: bytes
) -> None:
    # An answer for 16 inputs of unknown dimensions may hold 12 MB: parsed whole, millions of
    # values in a field nobody reads held every job's event loop as long as they took to build.
    vector = b"[" + b", ".join(b"0.25" for _ in range(1536)) + b"]"
    items = b", ".join(b'{"index": %d, "embedding": %s}' % (15 - i, vector) for i in range(16))
    body = (
        b'{"data": [' + items + b"], " + pad + b', "model": "m-2", "usage": {"prompt_tokens": 3}}'
    )
    assert len(body) < gateway_module.embeddings_answer_bytes(16, None)
    await http.get(server.url)  # the first request imports httpx's network backend: not timed
    server.answer = json_answer(body)
    with peak_memory() as peak:
        async with longest_gap() as gap:
            got = await gateway(http, server.url, pool).embeddings("m", ["a"] * 16)
    figures = (len(got.vectors), got.vectors[0][:2], got.model, got.usage.prompt_tokens)
    assert figures == (16, [0.25, 0.25], "m-2", 3)
    assert (gap[0] < 0.3, peak[0] < 80_000_000) == (True, True), (gap, peak)


@pytest.mark.parametrize(
    ("extra", "outcome"),
    [
        (b'"object": "list", "pad": [[], {"a": 1e999}]', "m-2"),
        (rb'"model": "m\ud800"', "m?"),  # a lone surrogate anywhere is read as '?'
        (b'"model": ""', "m"),
        # msgspec reads no NaN or Infinity, wherever it is: json read one beside the vectors.
        (b'"pad": [NaN]', RetryJob),
    ],
)
async def test_an_embeddings_answer_is_read_field_by_field(
    http: httpx.AsyncClient,
    pool: asyncpg.Pool,
    server: HostileServer,
    extra: bytes,
    outcome: str | type[Exception],
) -> None:
    items = b'{"index": 1, "embedding": [2]}, {"embedding": [0.5, 1e3]}'
    model = b'"model": "m-2", ' if b'"model"' not in extra else b""
    server.answer = json_answer(b'{"data": [' + items + b"], " + model + extra + b"}")
    if outcome is RetryJob:
        with pytest.raises(RetryJob, match="^AI gateway returned an embedding that is not a list"):
            await gateway(http, server.url, pool).embeddings("m", ["a", "b"])
        return
    got = await gateway(http, server.url, pool).embeddings("m", ["a", "b"])
    assert (got.vectors, got.model, got.usage) == ([[0.5, 1000.0], [2.0]], outcome, Usage(0, 0, 1))


async def test_a_lone_surrogate_beside_millions_of_escapes_is_a_body_that_is_not_json(
    http: httpx.AsyncClient, pool: asyncpg.Pool, server: HostileServer
) -> None:
    # A body msgspec refuses for a lone surrogate is rewritten an escape at a time: 7 million
    # escaped backslashes beside one took 3.6 s and a gigabyte. Past REWRITTEN_ESCAPES it is
    # refused as not JSON instead.
    text = b"\\\\" * 7_000_000 + b"\\ud800"
    server.answer = json_answer(b'{"choices": [{"message": {"content": "' + text + b'"}}]}')
    with peak_memory() as peak, pytest.raises(RetryJob) as caught:
        await gateway(http, server.url, pool).chat(CHAT)
    figures = (str(caught.value), peak[0] < 100_000_000)
    assert figures == ("AI gateway answered with a body that is not JSON", True), peak


TOKEN = "0123456789abcdef0123456789abcdef01234567"  # Forgejo's 40 hex characters


def _fragments(secret: str, text: str) -> list[str]:
    """Every piece of `secret` of six characters or more found in `text`."""
    return [
        secret[i:j]
        for i in range(len(secret))
        for j in range(i + 6, len(secret) + 1)
        if secret[i:j] in text
    ]


@pytest.mark.parametrize("before", [8, 19, 33])  # how much of the token fits before the cut
async def test_a_secret_echoed_across_the_message_s_cut_leaves_no_piece(
    http: httpx.AsyncClient, pool: asyncpg.Pool, server: HostileServer, tmp_path: Path, before: int
) -> None:
    """A proxy's error page that echoes the request's headers: the token was blanked only
    whole, after the message was cut to its length, so one straddling the cut left its first
    characters in error_msg (19 of Forgejo's 40)."""
    forgejo_cut = classify.MAX_DETAIL_CHARS - before
    server.answer = Answer(
        502,
        [("Content-Type", "text/plain")],
        b"x" * (forgejo_cut - 6) + (f" token {TOKEN} and more".encode()),
    )
    with pytest.raises(RetryJob) as forgejo:
        await Forgejo(http, server.url, Secret(TOKEN)).read(RepoFile("o", "r", "a.srt"))
    assert "***" in str(forgejo.value) and _fragments(TOKEN, str(forgejo.value)) == []

    key = "sk-or-v1-" + "a1b2c3d4" * 8
    prefix = len("AI gateway 400: ")
    message = "y" * (ai_errors.MAX_MESSAGE_CHARS - prefix - before - 8) + f" Bearer {key}"
    server.answer = json_answer(
        orjson.dumps(
            {"error": {"code": 400, "message": message, "metadata": {"reasons": [message]}}}
        ),
        status=400,
    )
    with pytest.raises(PermanentError) as ai:
        await AiGateway(http, server.url, Secret(key), RateLimiter(pool)).chat(CHAT)
    assert "***" in str(ai.value) and _fragments(key, str(ai.value)) == []
