"""What is sent to the AI gateway, made ready off the event loop: a request body with much text
encoded as JSON in a thread, a piece at a time, and handed to the connection in pieces; and text
made storable (no NUL, no lone surrogate), a long one in a thread, in pieces."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import orjson

from sidelinja_worker.services import bounded

# A request body with more characters of text than this is encoded in a thread, a string
# BODY_PIECE_CHARS characters at a time: one encoder call over a string of millions of
# characters holds the GIL, and so the event loop, until it is done (json.dumps took 0.10-0.15 s
# for the 16 M characters of a retry that feeds back an answer of 16 MB). After each piece the
# thread hands the GIL over (time.sleep(0)): else the loop waits up to the interpreter's switch
# interval, 5 ms, each time it takes the GIL back after a system call.
OFF_LOOP_BODY_CHARS = 256 * 1024
BODY_PIECE_CHARS = 64 * 1024
# The encoded body is handed to the connection this many bytes at a time: given whole, the
# transport copied 16 MB into its buffer in one step (~20 ms), each piece now waits its turn.
SEND_PIECE_BYTES = 1 << 20


async def storable_text(text: str) -> str:
    """`text` as PostgreSQL and a JSON encoder take it: without NUL characters (text and jsonb
    hold none), a lone surrogate (JSON's \\ud800 reads as one; no UTF-8 encoder takes it, and
    a retry that fed the answer back failed to encode) as '?'. A long text in a thread, in
    pieces, as each string method holds the GIL for all of the string it is given."""
    return await bounded.off_loop(_storable_pieces, text)


def _storable_pieces(text: str) -> str:
    return "".join(
        _storable(text[start : start + BODY_PIECE_CHARS])
        for start in range(0, len(text), BODY_PIECE_CHARS)
    )


def _storable(text: str) -> str:
    text = text.replace("\x00", "")
    return text if text.isascii() else text.encode("utf-8", "replace").decode("utf-8")


async def encoded_body(body: Mapping[str, Any]) -> bytes:
    """`body` as JSON; in a thread, in pieces, when it holds much text (OFF_LOOP_BODY_CHARS)."""
    if _text_chars(body) < OFF_LOOP_BODY_CHARS:
        return orjson.dumps(body)
    return await asyncio.to_thread(lambda: b"".join(_json_pieces(body)))


async def in_pieces(content: bytes) -> AsyncIterator[bytes]:
    for start in range(0, len(content), SEND_PIECE_BYTES):
        yield content[start : start + SEND_PIECE_BYTES]


def _text_chars(value: Any) -> int:
    """The characters of every string in a request body (a few dozen values, and the texts)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, Mapping):
        return sum(len(k) + _text_chars(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return sum(_text_chars(v) for v in value)
    return 0


def _json_pieces(value: Any) -> Iterator[bytes]:
    """JSON of `value`, a long string BODY_PIECE_CHARS characters per encoder call. A string's
    escapes are per character, so its pieces' encodings joined are the whole one's."""
    if isinstance(value, str) and len(value) > BODY_PIECE_CHARS:
        yield b'"'
        for start in range(0, len(value), BODY_PIECE_CHARS):
            yield orjson.dumps(value[start : start + BODY_PIECE_CHARS])[1:-1]
            time.sleep(0)
        yield b'"'
    elif isinstance(value, Mapping) and _text_chars(value) > BODY_PIECE_CHARS:
        yield b"{"
        for i, (key, item) in enumerate(value.items()):
            yield (b"," if i else b"") + orjson.dumps(key) + b":"
            yield from _json_pieces(item)
        yield b"}"
    elif isinstance(value, list | tuple) and _text_chars(value) > BODY_PIECE_CHARS:
        yield b"["
        for i, item in enumerate(value):
            if i:
                yield b","
            yield from _json_pieces(item)
        yield b"]"
    else:
        yield orjson.dumps(value)
