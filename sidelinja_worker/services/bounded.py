"""Answers of outside services read within bounds: at most a given size (declared or not, and
decoded: a compressed body is inflated a bounded piece at a time), a whole answer within a
deadline (a server that drips a byte at a time never stalls a job), no redirect followed, and a
big JSON body parsed in a thread rather than on the event loop."""

from __future__ import annotations

import asyncio
import functools
import json
import re
import zlib
from collections.abc import Callable, Iterator, Sized
from typing import Any, Concatenate, ParamSpec, TypeVar
from urllib.parse import urlsplit

import httpx
import msgspec

from sidelinja_worker.queue.errors import PermanentError, RetryJob

# Below this a JSON body parses in well under a millisecond: not worth a thread hop.
OFF_LOOP_JSON_BYTES = 256 * 1024
# Headers that described the body as it came over the wire, not the decoded bytes we keep.
_WIRE_HEADERS = frozenset({"content-encoding", "content-length", "transfer-encoding"})
# Requests ask for the body as it is. A server may compress it anyway (a proxy's setting): one
# layer of gzip or deflate is still read, inflated here at most this many bytes per call, with
# the loop given a turn between calls. httpx inflates a whole network read in one call: 64 kB of
# gzip is 64 MB, of zstd or of gzip in gzip two gigabytes, in one step of the event loop and in
# memory, before the size of the answer is checked.
INFLATE_PIECE_BYTES = 256 * 1024
# A service's error message is a line or a small JSON object at the start of its body; the rest
# of a long body is no part of it, and is never decoded, split or parsed.
ERROR_TEXT_BYTES = 8 * 1024
# A chunked body comes a chunk at a time, however small its chunks: one network read of 64 kB may
# hold 10,000 of one byte, each parsed on its own (10-20 µs), and none waits for the network. The
# loop gets a turn every so many chunks: a read of one-byte chunks held it 0.19 s. They are kept
# in one bytearray: as a list of bytes objects they took some 150 bytes per byte of the answer.
TURN_EVERY_CHUNKS = 64
_WBITS = {"gzip": zlib.MAX_WBITS | 16, "x-gzip": zlib.MAX_WBITS | 16, "deflate": zlib.MAX_WBITS}


async def send(
    http: httpx.AsyncClient,
    method: str,
    url: str,
    *,
    service: str,
    max_bytes: int,
    deadline_s: float,
    **kwargs: Any,
) -> httpx.Response:
    """The whole answer, its body read (decoded) up to `max_bytes`. A longer body, declared
    or found while reading, is a PermanentError naming the limit; a redirect is a
    PermanentError naming where it points (the client never follows one, to another host or
    not: a service's URL is configured where it is); the whole exchange past `deadline_s` is
    a RetryJob. Transport errors propagate for the caller to classify."""
    try:
        async with asyncio.timeout(deadline_s):
            return await _send(http, method, url, service, max_bytes, **kwargs)
    except TimeoutError:
        raise RetryJob(f"{service} did not answer within {deadline_s:g} s") from None


async def _send(
    http: httpx.AsyncClient, method: str, url: str, service: str, max_bytes: int, **kwargs: Any
) -> httpx.Response:
    request = http.build_request(method, url, **kwargs)
    request.headers["Accept-Encoding"] = "identity"
    response = await http.send(request, stream=True, follow_redirects=False)
    try:
        if 300 <= response.status_code < 400:
            raise PermanentError(redirect_message(service, response))
        declared = response.headers.get("content-length", "")
        if declared.strip().isdigit() and int(declared) > max_bytes:
            raise PermanentError(too_big(service, max_bytes, f"declares {int(declared)} bytes"))
        inflater = _inflater(service, response)
        body = bytearray()
        chunks = 0
        async for raw in response.aiter_raw():
            chunks += 1
            for chunk in [raw] if inflater is None else inflater.pieces(raw):
                body += chunk
                if len(body) > max_bytes:
                    raise PermanentError(too_big(service, max_bytes, "goes on"))
                if inflater is not None:
                    await asyncio.sleep(0)
            if chunks % TURN_EVERY_CHUNKS == 0:
                await asyncio.sleep(0)
        if inflater is not None:
            inflater.finish()
    except zlib.error as exc:
        raise PermanentError(
            f"{service} answered with a body that cannot be decoded: {exc}"
        ) from None
    finally:
        await response.aclose()
    headers = [(k, v) for k, v in response.headers.items() if k.lower() not in _WIRE_HEADERS]
    return httpx.Response(
        response.status_code, headers=headers, content=bytes(body), request=request
    )


class _Inflater:
    """One layer of gzip or deflate, inflated INFLATE_PIECE_BYTES at most per call. A gzip body
    may be several members one after another (what `gzip -c a >f; gzip -c b >>f` makes), read
    as one text: read to its first member's end only, an SRT lost its later cues unnoticed.
    Anything else after the compressed stream is not what the encoding says."""

    def __init__(self, encoding: str) -> None:
        self._members = encoding != "deflate"
        self._raw_deflate_tried = encoding != "deflate"
        self._inflate = zlib.decompressobj(_WBITS[encoding])
        self._fed = False
        self._after = b""  # what follows a finished member, too short yet to say what it is

    def pieces(self, data: bytes) -> Iterator[bytes]:
        """What `data` inflates to, in pieces; zlib.error when it is not what it claims."""
        self._fed = True
        while True:
            if self._inflate.eof:
                data = self._next_member(self._after + data)
                if not data:
                    return
            try:
                piece = self._inflate.decompress(data, INFLATE_PIECE_BYTES)
            except zlib.error:
                if self._raw_deflate_tried:
                    raise
                # "deflate" is sent with zlib's header or, by some servers, without one.
                self._raw_deflate_tried = True
                self._inflate = zlib.decompressobj(-zlib.MAX_WBITS)
                continue
            self._raw_deflate_tried = True
            # At a stream's end the rest of `data` is unused_data, else what a full piece left.
            data = self._inflate.unused_data if self._inflate.eof else self._inflate.unconsumed_tail
            if piece:
                yield piece
            elif not self._inflate.eof:  # all of `data` taken
                return

    def _next_member(self, rest: bytes) -> bytes:
        """`rest`, the bytes after a finished stream, when they begin another gzip member (the
        member then started); b"" when there are none, or too few yet to tell; zlib.error when
        they are anything else."""
        self._after = b""
        if not rest:
            return b""
        if self._members and _GZIP_MAGIC.startswith(rest[:2]):
            if len(rest) < len(_GZIP_MAGIC):
                self._after = rest
                return b""
            self._inflate = zlib.decompressobj(_WBITS["gzip"])
            return rest
        raise zlib.error("the body goes on after its compressed stream")

    def finish(self) -> None:
        """A zlib.error when the body ended before its compressed stream did (no body at all,
        as of a 204, is none)."""
        if self._fed and (self._after or not self._inflate.eof):
            raise zlib.error("the compressed stream ends early")


_GZIP_MAGIC = b"\x1f\x8b"  # how every gzip member begins


def _inflater(service: str, response: httpx.Response) -> _Inflater | None:
    """None for a body sent as it is; a PermanentError for an encoding not read here."""
    values = response.headers.get_list("content-encoding", split_commas=True)
    encodings = [v.strip().lower() for v in values if v.strip().lower() not in ("", "identity")]
    if not encodings:
        return None
    if len(encodings) == 1 and encodings[0] in _WBITS:
        return _Inflater(encodings[0])
    raise PermanentError(
        f"{service} answered with Content-Encoding {', '.join(encodings)!r}, which is not read "
        "here (the request asks for identity)"
    )


def redirect_message(service: str, response: httpx.Response) -> str:
    location = response.headers.get("location", "")
    host = urlsplit(location).hostname if "://" in location else None
    where = f"to host {host!r}" if host else "elsewhere"
    return (
        f"{service} answered {response.status_code}, a redirect {where}; redirects are not "
        "followed: configure the service's final URL"
    )


def too_big(service: str, max_bytes: int, how: str) -> str:
    return f"{service}'s answer {how}, over the limit of {max_bytes} bytes"


def text_start(response: httpx.Response) -> str:
    """The first ERROR_TEXT_BYTES of the body as UTF-8, what is not UTF-8 replaced. Never in
    the charset the answer names: httpx decodes with whichever codec Python has by that name,
    and punycode's decoder is quadratic (160 kB took 1.4 s on the event loop), idna's cannot
    replace what it cannot read and zlib's returns bytes."""
    return response.content[:ERROR_TEXT_BYTES].decode("utf-8", "replace")


def small_json(response: httpx.Response) -> Any:
    """The body as JSON when it is small enough to parse on the event loop, else None (as for a
    body that is not JSON): what is wanted of an error body is at its start."""
    if len(response.content) >= OFF_LOOP_JSON_BYTES:
        return None
    try:
        return loads(response.content)
    except ValueError:
        return None


B = TypeVar("B", bound=Sized)
P = ParamSpec("P")
T = TypeVar("T")


async def off_loop(
    work: Callable[Concatenate[B, P], T], body: B, *args: P.args, **kwargs: P.kwargs
) -> T:
    """`work(body, *args, **kwargs)`: on the event loop when `body` is shorter than
    OFF_LOOP_JSON_BYTES, else in a thread; what it raises is raised here. Reading a big body on
    the loop holds it, and every job on it, for as long as that takes. In a thread it still holds
    the GIL, and with it the loop, for each call into a parser; most readers of answers keep
    that short by skipping with msgspec what they do not build. Below the threshold the thread
    hop costs more than the work."""
    if len(body) < OFF_LOOP_JSON_BYTES:
        return work(body, *args, **kwargs)
    return await asyncio.to_thread(work, body, *args, **kwargs)


def loads(content: bytes) -> Any:
    """JSON, or ValueError. The parser recurses per level of nesting: a body of 100 kB of '['
    raises RecursionError, which callers that handle 'not JSON' as ValueError would miss."""
    try:
        return json.loads(content)
    except RecursionError:
        raise ValueError("JSON nested deeper than the parser's recursion limit") from None


_ABSENT = msgspec.Raw(b"null")
_TEXT = msgspec.json.Decoder(str | None)
_WHOLE = msgspec.json.Decoder(msgspec.Raw)  # checks that a body is JSON, building nothing


def fields(content: bytes | msgspec.Raw, names: tuple[str, ...]) -> dict[str, msgspec.Raw] | None:
    """The named fields of a JSON object, each as its raw JSON (null when absent), None when
    `content` is JSON but no object; ValueError when it is not JSON. Every other field is
    skipped, never built: json.loads builds all, holding the GIL (in a thread too) for as long
    as that takes, and 30 MB of empty lists beside a Forgejo file held the loop 2 s and took
    860 MB; skipped, 0.1 s and nothing."""
    try:
        try:
            return msgspec.structs.asdict(_fields_decoder(names).decode(content))
        except msgspec.ValidationError:  # no object, found at its first byte: is it JSON?
            _WHOLE.decode(content)
            return None
    except (msgspec.DecodeError, RecursionError) as exc:
        raise ValueError(f"not JSON: {exc}") from None


@functools.cache
def _fields_decoder(names: tuple[str, ...]) -> msgspec.json.Decoder[Any]:
    struct = msgspec.defstruct("Fields", [(name, msgspec.Raw, _ABSENT) for name in names])
    return msgspec.json.Decoder(struct)


def field_text(raw: msgspec.Raw) -> str | None:
    """A field's string; None when it is null or anything else (found at its first byte)."""
    try:
        return _TEXT.decode(raw)
    except msgspec.DecodeError:
        return None


def is_absent(raw: msgspec.Raw) -> bool:
    """Whether a field was null or not there at all."""
    return memoryview(raw) == b"null"


# A body with a lone surrogate is rewritten only when it holds at most this many escapes of
# backslashes and of \\u (a real answer holds few): more is read as a body that is not JSON.
REWRITTEN_ESCAPES = 200_000
# A JSON string escape: an escaped backslash (matched first, so that what follows it is never
# read as an escape), a surrogate pair, or a lone surrogate (group 1).
_ESCAPE = re.compile(
    rb"\\\\|\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}"
    rb"|(\\u[dD][89a-fA-F][0-9a-fA-F]{2})"
)
_LONE_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def lone_surrogates_replaced(content: bytes) -> bytes | None:
    """`content` with each escaped lone surrogate ("\\ud800") written as '?', what an encoder
    makes of one; None when it holds none. msgspec refuses a body with one anywhere, json
    reads it as a character no UTF-8 encoder takes. A pair (one character) is kept. None too
    for a body with more than REWRITTEN_ESCAPES escapes that may need a look (escaped backslashes
    and \\u escapes): each is a call, and millions of them took seconds and a gigabyte."""
    if _LONE_SURROGATE.search(content) is None:
        return None
    if content.count(b"\\\\") + content.count(b"\\u") > REWRITTEN_ESCAPES:
        return None

    def replace(match: re.Match[bytes]) -> bytes:
        return b"?" if match.group(1) else match.group(0)

    replaced = _ESCAPE.sub(replace, content)
    return None if replaced == content else replaced


@functools.cache
def _first_decoder() -> msgspec.json.Decoder[Any]:
    # An array-like struct reads its fields from an array's first items and skips the rest
    # unbuilt: millions of items after the first cost a skip each, not an object each.
    first = msgspec.defstruct("First", [("item", msgspec.Raw, _ABSENT)], array_like=True)
    return msgspec.json.Decoder(first)


def first_item(raw: msgspec.Raw) -> msgspec.Raw | None:
    """An array's first item as raw JSON (null when the array is empty), None when `raw` is
    not an array (found at its first byte); the other items are skipped, never built."""
    try:
        item: msgspec.Raw = _first_decoder().decode(raw).item
    except msgspec.ValidationError:
        return None
    return item


def field_string(raw: msgspec.Raw) -> str | None:
    """A field's string, a lone surrogate in it kept as json reads it (msgspec refuses one);
    None when it is null or anything else. ValueError for a string that is not JSON (invalid
    UTF-8): a raw field is skipped over, not checked, when the body is read."""
    text = field_text(raw)
    if text is None and bytes(memoryview(raw)[:1]) == b'"':
        found = json.loads(bytes(raw))  # one string: read in one linear pass
        return found if isinstance(found, str) else None
    return text


_FALSY = frozenset({b"null", b"false", b'""', b"0"})


def is_truthy(raw: msgspec.Raw) -> bool:
    """What Python's truth of the field's value would be, read from its raw JSON without
    building it: null, false, "", 0 and an empty array or object are false."""
    text = bytes(memoryview(raw)[:64]).strip()
    if text in _FALSY:
        return False
    if text[:1] in (b"[", b"{"):
        return text[1:].lstrip()[:1] not in (b"]", b"}")
    if text[:1] in b"-0123456789" and len(raw) < 64:
        try:
            return float(text) != 0
        except ValueError:
            return True
    return True


def small_value(raw: msgspec.Raw, max_bytes: int) -> Any:
    """A field's value: a string whatever its length, anything else built when its JSON is at
    most `max_bytes`, else its JSON's start as text (a value of millions of items is never
    built to be written out as a message of a few hundred characters). ValueError for JSON
    that is not (invalid UTF-8)."""
    text = field_string(raw)
    if text is not None:
        return text
    if len(raw) <= max_bytes:
        return loads(bytes(raw))
    return bytes(memoryview(raw)[:max_bytes]).decode("utf-8", "replace")
