"""Answers of outside services read within bounds: at most a given size (declared or not), a
whole answer within a deadline (a server that drips a byte at a time never stalls a job), no
redirect followed, and a big JSON body parsed in a thread rather than on the event loop."""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlsplit

import httpx

from sidelinja_worker.queue.errors import PermanentError, RetryJob

# Below this a JSON body parses in well under a millisecond: not worth a thread hop.
OFF_LOOP_JSON_BYTES = 256 * 1024
# Headers that described the body as it came over the wire, not the decoded bytes we keep.
_WIRE_HEADERS = frozenset({"content-encoding", "content-length", "transfer-encoding"})


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
    response = await http.send(request, stream=True, follow_redirects=False)
    try:
        if 300 <= response.status_code < 400:
            raise PermanentError(redirect_message(service, response))
        declared = response.headers.get("content-length", "")
        if declared.strip().isdigit() and int(declared) > max_bytes:
            raise PermanentError(too_big(service, max_bytes, f"declares {int(declared)} bytes"))
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > max_bytes:
                raise PermanentError(too_big(service, max_bytes, "goes on"))
            chunks.append(chunk)
    except httpx.DecodingError as exc:
        raise PermanentError(
            f"{service} answered with a body that cannot be decoded: {exc}"
        ) from None
    finally:
        await response.aclose()
    headers = [(k, v) for k, v in response.headers.items() if k.lower() not in _WIRE_HEADERS]
    return httpx.Response(
        response.status_code, headers=headers, content=b"".join(chunks), request=request
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


async def json_body(response: httpx.Response) -> Any:
    """The body as JSON, parsed in a thread when it is big. ValueError when it is not JSON."""
    content = response.content
    if len(content) < OFF_LOOP_JSON_BYTES:
        return loads(content)
    return await asyncio.to_thread(loads, content)


def loads(content: bytes) -> Any:
    """JSON, or ValueError. The parser recurses per level of nesting: a body of 100 kB of '['
    raises RecursionError, which callers that handle 'not JSON' as ValueError would miss."""
    try:
        return json.loads(content)
    except RecursionError:
        raise ValueError("JSON nested deeper than the parser's recursion limit") from None
