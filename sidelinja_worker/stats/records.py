"""The few fields of a Caddy JSON access-log line that counting needs, decoded by msgspec.

A typed decoder that names only these fields skips the rest of the ~900-byte line without
building Python objects for it: about 3x faster than orjson plus dict access (issue 8)."""

from __future__ import annotations

import msgspec


class Headers(msgspec.Struct, gc=False):
    # Caddy logs header values as arrays of strings under Go-canonical keys.
    user_agent: list[str] = msgspec.field(name="User-Agent", default_factory=list)
    range: list[str] = msgspec.field(name="Range", default_factory=list)


class RespHeaders(msgspec.Struct, gc=False):
    content_range: list[str] = msgspec.field(name="Content-Range", default_factory=list)
    content_length: list[str] = msgspec.field(name="Content-Length", default_factory=list)


class Request(msgspec.Struct, gc=False):
    method: str = ""
    uri: str = ""
    host: str = ""
    client_ip: str = ""
    remote_ip: str = ""
    headers: Headers = msgspec.field(default_factory=Headers)


class Entry(msgspec.Struct, gc=False):
    ts: float | str = 0.0  # float Unix seconds unless Caddy's time_format says otherwise
    status: int = 0
    size: int = 0
    request: Request = msgspec.field(default_factory=Request)
    resp_headers: RespHeaders = msgspec.field(default_factory=RespHeaders)


DECODER = msgspec.json.Decoder(Entry)


def decode(line: bytes) -> Entry | None:
    """The entry on `line`, or None when it is not a Caddy access-log entry. (One call per line
    measured faster here than one call per batch decoded as a JSON array.)"""
    try:
        return DECODER.decode(line)
    except msgspec.DecodeError:
        return None
