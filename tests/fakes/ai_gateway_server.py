"""A real HTTP server on 127.0.0.1 that speaks the OpenAI-compatible chat completions and
embeddings protocol the way OpenRouter does: Bearer keys, the
`{"error": {code, message, metadata}}` shape, Retry-After, errors inside an HTTP 200 answer.

Answers are scripted per test (`push`); with no script left, a chat request gets a valid answer
for the schema it names (`answers`), and an embeddings request gets deterministic vectors. Every
request is recorded, so tests can assert on prompts, models and headers."""

from __future__ import annotations

import hashlib
import itertools
import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

KEY = "sk-or-v1-test-0123456789abcdef0123456789abcdef"
PREFIX = "/api/v1"


@dataclass(frozen=True)
class Reply:
    status: int = 200
    body: Any = None  # a dict (sent as JSON) or str (sent as is)
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0  # hold the answer back (timeouts)


@dataclass(frozen=True)
class Recorded:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]

    @property
    def schema_name(self) -> str | None:
        fmt = self.body.get("response_format") or {}
        return (fmt.get("json_schema") or {}).get("name")

    def text(self) -> str:
        """Every message's content, joined: what the model was shown."""
        return "\n".join(m.get("content") or "" for m in self.body.get("messages", []))

    def message(self, role: str) -> str:
        return "\n".join(
            m.get("content") or "" for m in self.body.get("messages", []) if m.get("role") == role
        )


Script = Reply | Callable[[Recorded], Reply]
_ids = itertools.count(1)


def completion(
    content: Any, *, model: str = "openai/gpt-4o-mini", finish_reason: str = "stop"
) -> Reply:
    """A chat.completion; `content` that is not a str is sent as its JSON (structured output)."""
    text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
    return Reply(
        200,
        {
            "id": f"gen-{next(_ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "system_fingerprint": None,
            "choices": [
                {
                    "index": 0,
                    "finish_reason": finish_reason,
                    "native_finish_reason": finish_reason,
                    "message": {"role": "assistant", "content": text},
                }
            ],
            "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
        },
    )


def error(
    status: int,
    message: str,
    metadata: dict[str, Any] | None = None,
    *,
    retry_after: str | None = None,
) -> Reply:
    body: dict[str, Any] = {"code": status, "message": message}
    if metadata is not None:
        body["metadata"] = metadata
    return Reply(status, {"error": body}, {"Retry-After": retry_after} if retry_after else {})


def error_in_choice(code: int, message: str) -> Reply:
    """An error after generation started: HTTP 200, `finish_reason: "error"`."""
    return Reply(
        200,
        {
            "id": f"gen-{next(_ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": "openai/gpt-4o-mini",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "error",
                    "native_finish_reason": "error",
                    "message": {"role": "assistant", "content": ""},
                    "error": {"code": code, "message": message},
                }
            ],
        },
    )


ANSWERS: dict[str, Callable[[Recorded], Any]] = {
    "Analysis": lambda r: {
        "title_suggestions": ["Byvalget i Tromsø", "Kampen om kommunen"],
        "summary": "Episoden handler om byvalget.",
        "topics": ["lokalvalg"],
        "chapters": [{"start": "0:00:00", "title": "Innledning", "summary": "Vi starter."}],
        "people": [{"name": "Kari Nordmann", "role": "ordfører"}],
    },
    "Clip": lambda r: {
        "title": "Havvind",
        "summary": "Regjeringen lyser ut nye felt.",
        "key_points": ["Nye felt i Nordsjøen"],
        "entities": [{"name": "Equinor", "kind": "organisation"}],
        "quotes": [{"text": "Dette er et stort steg.", "speaker": "Terje Aasland"}],
    },
    "Note": lambda r: {
        "title": "Notat",
        "body": "Ring Kari om opptaket.",
        "tasks": [{"what": "Ring Kari", "due": "fredag"}],
    },
    "Minutes": lambda r: {
        "summary": "Redaksjonsmøte om høstens program.",
        "decisions": ["Ny episode hver tirsdag"],
        "action_points": [{"who": "Ola", "what": "Booke studio", "due": "2025-03-07"}],
    },
}


class FakeAiGateway:
    def __init__(self, key: str = KEY) -> None:
        self.key = key
        self.requests: list[Recorded] = []
        self.answers: dict[str, Callable[[Recorded], Any]] = dict(ANSWERS)
        # Optional: the answer to a plain (not json_schema) chat request, and the vector for an
        # embeddings input (text, dimensions); unset, the defaults below answer.
        self.plain_answer: Callable[[Recorded], str] | None = None
        self.vector: Callable[[str, int], list[float]] | None = None
        self._script: deque[Script] = deque()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}{PREFIX}"

    def push(self, *replies: Script) -> None:
        """Answers for the next requests, in order; a callable gets the request."""
        with self._lock:
            self._script.extend(replies)

    def chat_requests(self) -> list[Recorded]:
        with self._lock:
            return [r for r in self.requests if r.path.endswith("/chat/completions")]

    def start(self) -> FakeAiGateway:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()

    def answer(self, path: str, headers: dict[str, str], body: Any) -> Reply:
        recorded = Recorded(path, headers, body if isinstance(body, dict) else {})
        with self._lock:
            self.requests.append(recorded)
        if headers.get("authorization") != f"Bearer {self.key}":
            return error(401, "No auth credentials found")
        if not isinstance(body, dict):
            return error(400, "Request body is not valid JSON")
        with self._lock:
            scripted = self._script.popleft() if self._script else None
        if scripted is not None:
            return scripted(recorded) if callable(scripted) else scripted
        if path == f"{PREFIX}/chat/completions":
            return self._default_chat(recorded)
        if path == f"{PREFIX}/embeddings":
            return _embeddings(body, self.vector or _vector)
        return error(404, f"Not found: {path}")

    def _default_chat(self, recorded: Recorded) -> Reply:
        if recorded.body.get("response_format", {}).get("type") != "json_schema":
            if self.plain_answer is not None:
                return completion(
                    self.plain_answer(recorded), model=recorded.body.get("model", "unknown")
                )
            return completion("plain text answer")
        make = self.answers.get(recorded.schema_name or "")
        if make is None:
            return error(400, f"no canned answer for schema {recorded.schema_name!r}")
        return completion(make(recorded), model=recorded.body.get("model", "unknown"))

    def wait_or_stop(self, delay_s: float) -> None:
        self._stopping.wait(delay_s)


def _embeddings(
    body: dict[str, Any], vector: Callable[[str, int], list[float]] | None = None
) -> Reply:
    vector = vector or _vector
    inputs = body.get("input")
    inputs = [inputs] if isinstance(inputs, str) else list(inputs or [])
    dims = int(body.get("dimensions") or 8)
    data = [
        {"object": "embedding", "index": i, "embedding": vector(text, dims)}
        for i, text in enumerate(inputs)
    ]
    # Out of order on purpose: clients must sort by `index`.
    return Reply(
        200,
        {
            "object": "list",
            "data": data[::-1],
            "model": body.get("model"),
            "usage": {"prompt_tokens": 3 * len(inputs), "total_tokens": 3 * len(inputs)},
        },
    )


def _vector(text: str, dims: int) -> list[float]:
    digest = hashlib.sha256(text.encode()).digest()
    return [round(digest[i % len(digest)] / 255, 4) for i in range(dims)]


def _handler_for(gateway: FakeAiGateway) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                body: Any = json.loads(raw or b"null")
            except ValueError:
                body = None
            headers = {k.lower(): v for k, v in self.headers.items()}
            reply = gateway.answer(self.path, headers, body)
            if reply.delay_s:
                gateway.wait_or_stop(reply.delay_s)
            self._send(reply)

        def _send(self, reply: Reply) -> None:
            data = reply.body if isinstance(reply.body, str) else json.dumps(reply.body)
            payload = data.encode()
            try:
                self.send_response(reply.status)
                ctype = "application/json" if not isinstance(reply.body, str) else "text/html"
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(payload)))
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(payload)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (a timeout test)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@pytest.fixture(name="ai_gateway")
def ai_gateway_fixture() -> Iterator[FakeAiGateway]:
    """Import it into a test module to use `ai_gateway` as a test argument."""
    gateway = FakeAiGateway().start()
    yield gateway
    gateway.stop()
