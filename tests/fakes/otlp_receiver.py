"""An OTLP/HTTP trace receiver, as a collector serves it: POST /v1/traces with a protobuf
`ExportTraceServiceRequest` (gzip or not), decoded with opentelemetry-proto; the spans are kept
as plain values to assert on. And a collector that never answers: it accepts connections and
reads, and sends nothing back."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

PROTOBUF = "application/x-protobuf"
KINDS = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}
STATUSES = {0: "unset", 1: "ok", 2: "error"}


@dataclass(frozen=True)
class Event:
    name: str
    attributes: dict[str, Any]


@dataclass(frozen=True)
class ReceivedSpan:
    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    parent_span_id: str  # "" for a root
    name: str
    kind: str
    attributes: dict[str, Any]
    status: str
    status_message: str
    events: tuple[Event, ...]
    resource: dict[str, Any]
    scope: str


@dataclass
class OtlpReceiver:
    spans: list[ReceivedSpan] = field(default_factory=list)
    requests: int = 0
    arrived: asyncio.Event = field(default_factory=asyncio.Event)  # set on each export
    url: str = ""  # set once it is serving

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024**2)
        app.router.add_post("/v1/traces", self.traces)
        return app

    async def traces(self, request: web.Request) -> web.Response:
        if request.content_type != PROTOBUF:
            return web.Response(status=415, text=f"expected {PROTOBUF}")
        body = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        export = ExportTraceServiceRequest()
        export.ParseFromString(body)  # a malformed body raises: the test sees a 500
        self.requests += 1
        self.spans.extend(_spans(export))
        self.arrived.set()
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(), content_type=PROTOBUF
        )

    def named(self, name: str) -> list[ReceivedSpan]:
        return [s for s in self.spans if s.name == name]

    def of_job(self, job_id: object) -> list[ReceivedSpan]:
        """The spans of a job's attempts, oldest first."""
        found = [s for s in self.spans if s.attributes.get("messaging.message.id") == str(job_id)]
        return sorted(found, key=lambda s: s.attributes["sidelinja.job.attempt"])


def _spans(export: ExportTraceServiceRequest) -> list[ReceivedSpan]:
    found = []
    for resource_spans in export.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                found.append(
                    ReceivedSpan(
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        name=span.name,
                        kind=KINDS.get(span.kind, str(span.kind)),
                        attributes=_attributes(span.attributes),
                        status=STATUSES.get(span.status.code, str(span.status.code)),
                        status_message=span.status.message,
                        events=tuple(Event(e.name, _attributes(e.attributes)) for e in span.events),
                        resource=resource,
                        scope=scope_spans.scope.name,
                    )
                )
    return found


def _attributes(pairs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in pairs if isinstance(kv, KeyValue)}


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


@asynccontextmanager
async def silent_collector() -> AsyncIterator[str]:
    """A collector that takes connections and requests and never answers; yields its URL."""
    held: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        while await reader.read(65536):
            pass

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    host, port = server.sockets[0].getsockname()[:2]
    try:
        yield f"http://{host}:{port}"
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()
