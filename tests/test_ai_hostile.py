"""The AI gateway client and the AI job types against absurd sizes: no step of theirs holds the
event loop (every other job of the worker, its heartbeat and timeouts) for long."""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
from collections.abc import AsyncIterator
from typing import Any, ClassVar
from uuid import UUID

import asyncpg
import httpx
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from sidelinja_worker.jobs.ai import dictation_cleanup, meeting_summarize
from sidelinja_worker.jobs.ai import store as ai_store
from sidelinja_worker.jobs.ai.common import combine_answers, resolve_settings
from sidelinja_worker.jobs.ai.dictation_cleanup import Note, NoteTask
from sidelinja_worker.jobs.ai.meeting_summarize import Minutes
from sidelinja_worker.queue.config import Secret
from sidelinja_worker.queue.errors import PermanentError
from sidelinja_worker.queue.limits import RateLimiter
from sidelinja_worker.services import ai_requests
from sidelinja_worker.services.ai_gateway import AiGateway
from tests.fakes.hostile_server import hostile_server, json_answer
from tests.fakes.stalls import longest_stall, peak_memory
from tests.test_ai_jobs import add_transcript

# 16 M characters (28 MB as UTF-8): more than a retry that feeds back an answer of 16 MB sends,
# so that the old step stands clear of the debug mode's own costs.
HUGE_TEXT = "æøå " * 4_000_000
ANSWER = orjson.dumps({"choices": [{"message": {"content": "{}"}}]})


class Sink(asyncio.Protocol):
    """A server that counts a request's body away as it comes (the hostile server keeps it, and
    copying 16 MB would be a stall of the test's own) and answers ANSWER."""

    def __init__(self) -> None:
        self.head = b""
        self.left: int | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.left is None:
            self.head += data
            head, found, rest = self.head.partition(b"\r\n\r\n")
            if not found:
                return
            length = re.search(rb"(?i)content-length: *(\d+)", head)
            assert length is not None
            self.left = int(length[1]) - len(rest)
        else:
            self.left -= len(data)
        if self.left == 0:
            self.transport.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                + f"Content-Length: {len(ANSWER)}\r\n\r\n".encode()
                + ANSWER
            )
            self.transport.close()


@contextlib.asynccontextmanager
async def sink() -> AsyncIterator[str]:
    server = await asyncio.get_running_loop().create_server(Sink, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()


async def test_a_huge_request_body_is_encoded_off_the_event_loop(pool: asyncpg.Pool) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": HUGE_TEXT}]}
    async with sink() as url, httpx.AsyncClient() as http:
        gateway = AiGateway(http, url, Secret("k"), RateLimiter(pool))
        # The first request imports httpx's network backend and opens anyio's: not timed.
        await gateway.chat({"model": "m", "messages": [{"role": "user", "content": "hei"}]})
        with longest_stall() as longest:
            await asyncio.sleep(0)  # a new step, timed: this one started before the block
            content, _usage = await gateway.chat(body)
            await asyncio.sleep(0)  # the step that got the answer ends inside the block
    assert content == "{}"
    assert longest[0] < 0.1, longest


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(value=JSON_VALUES)
def test_a_body_encoded_in_pieces_is_the_body_encoded_whole(value: object) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ai_requests, "BODY_PIECE_CHARS", 3)  # every string of 4+ characters cut
        pieces = b"".join(ai_requests._json_pieces(value))
    assert pieces == orjson.dumps(value)


class Summary(BaseModel):
    summary: str


async def test_an_answer_holding_a_lone_surrogate_is_read_as_text(
    pool: asyncpg.Pool,
) -> None:
    # JSON's \ud800 reads as a lone surrogate, which no UTF-8 encoder takes: the retry that
    # fed the answer back could not be sent, an unexpected error instead of the job's outcome.
    answer = rb'{"choices": [{"message": {"content": "{\"summary\": \"x\ud800\"}"}}]}'
    async with hostile_server(json_answer(answer)) as server, httpx.AsyncClient() as http:
        gateway = AiGateway(http, server.url, Secret("k"), RateLimiter(pool))
        got = await gateway.structured("m", [{"role": "user", "content": "hei"}], Summary)
    assert got.value.summary == "x?"  # kept as text, the character no encoder takes replaced
    assert len(server.requests) == 1


async def test_a_long_transcript_is_read_without_stalling_the_loop(
    pool: asyncpg.Pool, workspace: UUID
) -> None:
    await add_transcript(pool, workspace, "ep", [(0, " Hei ")])
    await pool.execute(
        "INSERT INTO transcript_segments (workspace_id, transcript_ref, seq, start_ms, end_ms, text)"
        " SELECT $1, 'ep', i, i * 1500, i * 1500 + 900, ' Hei du og meg, en setning her. '"
        " FROM generate_series(2, 200000) AS i",
        workspace,
    )
    with longest_stall() as longest:
        await asyncio.sleep(0)  # a new step, timed: this one started before the block
        text = await ai_store.transcript_text(pool, workspace, "ep")
        await asyncio.sleep(0)  # the step that got the text ends inside the block
    assert text is not None
    lines = text.splitlines()
    assert (len(lines), lines[0], lines[-1]) == (
        200_000,
        "[0:00:00] Hei",
        "[83:20:00] Hei du og meg, en setning her.",
    )
    # Before, the lines were built on the loop: 0.3-0.4 s for 200,000 segments.
    assert longest[0] < 0.1, longest


@pytest.mark.parametrize("with_segments", [True, False])
async def test_a_transcript_of_a_gigabyte_is_refused_unread(
    pool: asyncpg.Pool, workspace: UUID, with_segments: bool
) -> None:
    """A transcript is any writer's row: 40 MB of segments (or of plain text) came over the
    connection whole and was decoded on the event loop, and a row may hold a gigabyte. Its size
    is compared in the database, and the job fails naming it."""
    await add_transcript(pool, workspace, "ep", [(0, "Hei")])
    if with_segments:
        await pool.execute(
            "INSERT INTO transcript_segments"
            " (workspace_id, transcript_ref, seq, start_ms, end_ms, text)"
            " SELECT $1, 'ep', i, i * 1000, i * 1000 + 900, repeat('ord ', 100000)"
            " FROM generate_series(2, 101) AS i",
            workspace,
        )
    else:
        await pool.execute("DELETE FROM transcript_segments WHERE workspace_id = $1", workspace)
        await pool.execute(
            "UPDATE transcripts SET plain_text = repeat('ord ', 10000000) WHERE workspace_id = $1",
            workspace,
        )
    with peak_memory() as peak, pytest.raises(PermanentError) as refused:
        await ai_store.transcript_text(pool, workspace, "ep")
    assert "transcript 'ep' is 40,0" in str(refused.value), refused.value
    assert "over the 33,554,432 an AI job reads" in str(refused.value)
    assert peak[0] < 20_000_000, peak


async def test_a_transcript_is_read_as_timestamped_lines(
    pool: asyncpg.Pool, workspace: UUID
) -> None:
    await add_transcript(
        pool, workspace, "ep", [(0, " Hei "), (65_900, "Og velkommen\t"), (3_725_900, "Sist")]
    )
    assert await ai_store.transcript_text(pool, workspace, "ep") == (
        "[0:00:00] Hei\n[0:01:05] Og velkommen\n[1:02:05] Sist\n"
    )


class Numbers(BaseModel):
    values: list[int]


async def test_an_answer_of_millions_of_items_is_refused_unparsed(pool: asyncpg.Pool) -> None:
    # Validating it held the GIL, and so the loop, though in a thread: pydantic validates in one
    # call. Numbers, so that reading the gateway's JSON around it (json.loads, one call too, of
    # a body whose escapes cost it 0.1 s for 300,000 action points) is not what is measured.
    content = orjson.dumps({"values": [1] * 3_000_000}).decode()
    answer = orjson.dumps({"choices": [{"message": {"content": content}}]})
    async with hostile_server(json_answer(answer)) as server, httpx.AsyncClient() as http:
        gateway = AiGateway(http, server.url, Secret("k"), RateLimiter(pool))
        with longest_stall() as longest, pytest.raises(PermanentError) as refused:
            await asyncio.sleep(0)  # a new step, timed: this one started before the block
            await gateway.structured("m", [{"role": "user", "content": "tell"}], Numbers)
        await asyncio.sleep(0)
    assert "characters, more than the" in str(refused.value)
    assert len(server.requests) == 2  # asked once more, saying why
    assert longest[0] < 0.1, longest


class _WhereWritten(Minutes):
    """Minutes that note whether each was written as JSON on the event loop's thread."""

    on_loop: ClassVar[list[bool]] = []

    def model_dump_json(self, **options: Any) -> str:
        self.on_loop.append(threading.current_thread() is threading.main_thread())
        return super().model_dump_json(**options)


async def test_answers_combined_by_the_model_are_written_as_json_off_the_event_loop(
    pool: asyncpg.Pool,
) -> None:
    # Each part's answer is written as JSON for the combine request. Sixty answers of 13,000
    # action points took ~0.25 s, on the loop; in a thread, which hands the loop the GIL between
    # two answers, its longest step measured 0.06-0.11 s (pydantic holds the GIL through one
    # answer, and the loop waits for it at each of its system calls).
    parts = [_WhereWritten(summary=f"part {p}", decisions=[], action_points=[]) for p in range(3)]
    small = orjson.dumps({"summary": "all", "decisions": [], "action_points": []}).decode()
    answer = orjson.dumps({"choices": [{"message": {"content": small}}]})
    settings = resolve_settings({}, meeting_summarize.TASK)
    async with hostile_server(json_answer(answer)) as server, httpx.AsyncClient() as http:
        gateway = AiGateway(http, server.url, Secret("k"), RateLimiter(pool))
        combined, usage = await combine_answers(
            gateway, meeting_summarize.TASK, settings, list(parts), ""
        )
    assert combined.summary == "all" and usage.calls == len(server.requests) == 1
    assert _WhereWritten.on_loop == [False, False, False]


async def test_a_split_dictations_notes_are_merged_off_the_event_loop() -> None:
    # Forty parts, each answered with 15,000 tasks (each answer within its length limit):
    # merged on the loop, 0.40-0.42 s.
    notes = [
        Note(title="t", body="b", tasks=[NoteTask(what=f"w{p}-{i}") for i in range(15_000)])
        for p in range(40)
    ]
    settings = resolve_settings({}, dictation_cleanup.TASK)
    with longest_stall() as longest:
        await asyncio.sleep(0)  # a new step, timed: this one started before the block
        merged, usage = await combine_answers(None, dictation_cleanup.TASK, settings, notes, "")
        await asyncio.sleep(0)
    assert (len(merged.tasks), usage.calls) == (600_000, 0)
    assert longest[0] < 0.1, longest
