"""OpenTelemetry traces: a span per job attempt, parented on the W3C `traceparent` its row
carries, with the outside HTTP calls of its handler as child spans.

Off unless the standard `OTEL_*` variables ask for it (`wanted_exporters`): then `ENABLED`
stays False, OpenTelemetry is never imported, and a job pays one module attribute read. On,
spans go through a bounded BatchSpanProcessor to the exporters named, on a thread of their own,
so a slow or unreachable collector costs the worker dropped spans, never a late job."""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Mapping
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.trace import Span, Tracer

    from sidelinja_worker.queue.jobs import ClaimedJob

log = logging.getLogger("sidelinja_worker.tracing")

# Read once per job by the executor, and by the client on enqueue: nothing else of tracing
# runs while it is False.
ENABLED = False

SERVICE_NAME = "sidelinja-worker"
INSTRUMENTATION_NAME = "sidelinja_worker"
EXPORTERS = ("otlp", "console")
# At stop, queued spans get this long to reach the collector; then they are dropped, so that
# an unreachable collector never holds up a stopping worker.
SHUTDOWN_FLUSH_S = 5.0
# The processor's queue is bounded by OTEL_BSP_MAX_QUEUE_SIZE (default 2,048): a span that
# finds it full is dropped. A value past this cap is taken as the cap, to bound memory.
MAX_QUEUE_SIZE = 65_536
DEFAULT_BATCH_SIZE = 512  # OTEL_BSP_MAX_EXPORT_BATCH_SIZE's default
# An export request waits at most this long (OTEL_EXPORTER_OTLP_TIMEOUT, default 10 s, is
# clamped to it): it blocks only the exporter's thread, but the next batch waits behind it.
MAX_EXPORT_TIMEOUT_S = 30.0

# Attribute values are cut to this length unless OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT is set.
MAX_ATTRIBUTE_CHARS = 4096

# The outcomes that set the span's status to error.
FAILED_OUTCOMES = frozenset({"retry", "error", "timeout"})

# W3C Trace Context, version 00 only: lowercase hex, exactly 55 characters. A row's value is
# hostile (any SQL writer sets it): anything else is ignored and the job starts a new trace.
TRACEPARENT_CHARS = 55
_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_TRUE = frozenset({"true", "1", "yes", "on"})

_provider: TracerProvider | None = None
_processors: list[BatchSpanProcessor] = []
_tracer: Tracer | None = None
_api: Any = None  # the OpenTelemetry calls a job's span makes, looked up once (_bind_api)
_users = 0  # workers in this process that started tracing and have not stopped it yet


def parse_traceparent(value: object) -> tuple[int, int, int] | None:
    """(trace id, parent span id, flags) of a valid version 00 `traceparent`, else None."""
    if not isinstance(value, str) or len(value) != TRACEPARENT_CHARS:
        return None
    match = _TRACEPARENT.fullmatch(value)
    if match is None:
        return None
    trace_id, span_id = int(match[1], 16), int(match[2], 16)
    if not trace_id or not span_id:
        return None
    return trace_id, span_id, int(match[3], 16)


def valid_traceparent(value: object) -> str | None:
    """`value` if it is a traceparent this worker would use, else None."""
    if isinstance(value, str) and parse_traceparent(value) is not None:
        return value
    return None


def wanted_exporters(environ: Mapping[str, str]) -> list[str]:
    """The span exporters the `OTEL_*` variables ask for; empty: tracing stays off.

    On when OTEL_TRACES_EXPORTER names an exporter (`otlp`, `console`, comma-separated), or,
    with it unset, when an OTLP endpoint is set (OTEL_EXPORTER_OTLP_ENDPOINT or
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT; empty counts as unset): the SDK's own default exporter is otlp, but a worker
    nobody configured for traces must not try to reach localhost:4318. OTEL_SDK_DISABLED=true
    and OTEL_TRACES_EXPORTER=none keep it off whatever else is set."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() in _TRUE:
        return []
    named = environ.get("OTEL_TRACES_EXPORTER", "").strip()
    if not named:  # unset or empty
        endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get(
            "OTEL_EXPORTER_OTLP_ENDPOINT"
        )
        return ["otlp"] if endpoint and endpoint.strip() else []
    names = [n.strip().lower() for n in named[:200].split(",") if n.strip()]
    if "none" in names:
        return []
    unknown = [n for n in names if n not in EXPORTERS]
    if unknown:
        log.warning(
            "OTEL_TRACES_EXPORTER: %s not supported here (only %s); ignored",
            ", ".join(unknown),
            ", ".join(EXPORTERS),
        )
    return list(dict.fromkeys(n for n in names if n in EXPORTERS))


def start(service_version: str | None = None) -> bool:
    """Starts tracing from the `OTEL_*` variables, if they ask for it; returns whether it is
    on. Each call is matched by a `stop`; the first sets up, the last shuts down."""
    global _users
    _users += 1
    if _provider is not None:
        return True
    exporters = wanted_exporters(os.environ)
    if not exporters:
        return False
    try:
        _set_up(exporters, service_version)
    except ImportError as exc:
        log.warning(
            "OTEL_* asks for traces, but OpenTelemetry is not installed (%s): running without; "
            "install the extra: pip install 'sidelinja-worker[otel]'",
            exc,
        )
        return False
    except ValueError as exc:  # the SDK refuses a malformed OTEL_* value (a limit, a sampler)
        log.warning("tracing off: an OTEL_* setting is not valid (%s)", exc)
        return False
    return True


def _set_up(exporters: list[str], service_version: str | None) -> None:
    global ENABLED, _provider, _processors, _tracer
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import SpanLimits, TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SpanExporter,
    )

    attributes: dict[str, Any] = {}
    if not _names_service(os.environ):
        attributes["service.name"] = SERVICE_NAME
    if service_version:
        attributes["service.version"] = service_version
    # The sampler comes from OTEL_TRACES_SAMPLER (default parentbased_always_on: a row whose
    # traceparent says "not sampled" is not recorded either); the resource from
    # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES. No exit hook: `stop` bounds the flush.
    # Attribute values (an exception's message and stack trace among them) are cut to
    # MAX_ATTRIBUTE_CHARS unless OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT says otherwise: an outside
    # service's error text can be megabytes.
    limits = SpanLimits(
        max_attribute_length=None
        if os.environ.get("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "").strip()
        else MAX_ATTRIBUTE_CHARS
    )
    provider = TracerProvider(
        resource=Resource.create(attributes), span_limits=limits, shutdown_on_exit=False
    )
    processors = []
    for name in exporters:
        exporter: SpanExporter
        if name == "otlp":
            exporter = _otlp_exporter()
        else:
            exporter = ConsoleSpanExporter()
        queue_size, batch_size = _queue_sizes(os.environ)
        batch = BatchSpanProcessor(
            exporter, max_queue_size=queue_size, max_export_batch_size=batch_size
        )
        provider.add_span_processor(batch)
        processors.append(batch)
    # Handlers that make spans of their own (opentelemetry.trace.get_tracer) get this provider,
    # unless the process had one already.
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        trace.set_tracer_provider(provider)
    _provider, _processors = provider, processors
    _tracer = provider.get_tracer(INSTRUMENTATION_NAME, service_version)
    _bind_api()
    ENABLED = True
    log.info("tracing on: spans to %s", ", ".join(exporters))


def _otlp_exporter() -> Any:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
    )
    if protocol.strip() != "http/protobuf":
        log.warning(
            "OTEL_EXPORTER_OTLP_PROTOCOL=%s not supported: spans go as http/protobuf",
            protocol[:40],
        )
    return OTLPSpanExporter(timeout=_export_timeout_s(os.environ))


def _names_service(environ: Mapping[str, str]) -> bool:
    if environ.get("OTEL_SERVICE_NAME", "").strip():
        return True
    return any(
        pair.split("=", 1)[0].strip() == "service.name"
        for pair in environ.get("OTEL_RESOURCE_ATTRIBUTES", "").split(",")
    )


def _queue_sizes(environ: Mapping[str, str]) -> tuple[int | None, int | None]:
    """(queue size, export batch size): OTEL_BSP_MAX_QUEUE_SIZE within 1..MAX_QUEUE_SIZE and
    OTEL_BSP_MAX_EXPORT_BATCH_SIZE (default 512) no larger (the SDK refuses a batch larger
    than the queue). None: the SDK's default, for an unset or malformed value."""
    queue = _positive_int(environ.get("OTEL_BSP_MAX_QUEUE_SIZE"))
    if queue is None:
        return None, None
    queue = min(queue, MAX_QUEUE_SIZE)
    batch = _positive_int(environ.get("OTEL_BSP_MAX_EXPORT_BATCH_SIZE")) or DEFAULT_BATCH_SIZE
    return queue, min(batch, queue)


def _positive_int(raw: str | None) -> int | None:
    try:
        value = int(raw or "")
    except ValueError:
        return None
    return value if value > 0 else None


def _export_timeout_s(environ: Mapping[str, str]) -> float:
    """OTEL_EXPORTER_OTLP_TRACES_TIMEOUT or OTEL_EXPORTER_OTLP_TIMEOUT (seconds, per the
    specification), default 10, within (0, MAX_EXPORT_TIMEOUT_S]."""
    raw = environ.get("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT") or environ.get(
        "OTEL_EXPORTER_OTLP_TIMEOUT", ""
    )
    try:
        value = float(raw)
    except ValueError:
        return 10.0
    if not 0 < value < float("inf"):
        return 10.0
    return min(value, MAX_EXPORT_TIMEOUT_S)


def stop() -> None:
    """Undoes one `start`; the last one sends what is queued (for at most SHUTDOWN_FLUSH_S)
    and turns tracing off."""
    global ENABLED, _users, _provider, _processors, _tracer
    _users = max(_users - 1, 0)
    if _users or _provider is None:
        return
    processors, _processors = _processors, []
    ENABLED, _provider, _tracer = False, None, None
    # The processors' own shutdown waits up to 30 s for a collector; a daemon thread bounds
    # it, and a request still hanging on a dead collector ends with the process.
    flush = threading.Thread(
        target=lambda: [each.shutdown() for each in processors], name="otel-flush", daemon=True
    )
    flush.start()
    flush.join(SHUTDOWN_FLUSH_S)
    if flush.is_alive():
        log.warning("tracing: spans not sent within %g s of stopping are dropped", SHUTDOWN_FLUSH_S)


def enable(provider: TracerProvider | None = None) -> None:
    """For an application that set OpenTelemetry up itself and enqueues jobs with the client:
    jobs it enqueues carry its current span's context. Spans go to `provider` (default: the
    global one); `stop` is not needed."""
    global ENABLED, _tracer
    from opentelemetry import trace

    source = provider or trace.get_tracer_provider()
    _tracer = source.get_tracer(INSTRUMENTATION_NAME)
    _bind_api()
    ENABLED = True


def _bind_api() -> None:
    global _api
    from opentelemetry import context, trace
    from opentelemetry.trace import SpanKind, Status, StatusCode

    _api = SimpleNamespace(
        attach=context.attach,
        detach=context.detach,
        set_span_in_context=trace.set_span_in_context,
        CONSUMER=SpanKind.CONSUMER,
        Status=Status,
        ERROR=StatusCode.ERROR,
    )


# -- the worker's side --------------------------------------------------------------------------


def start_job_span(job: ClaimedJob, worker_id: object) -> tuple[Span, object]:
    """The span of this attempt of `job`, made current in this task; the token undoes that.
    Its attributes are few and not repeated under two names: each costs the SDK a few µs to
    check and the exporter to encode, per job."""
    assert _tracer is not None and _api is not None
    span = _tracer.start_span(
        f"process {job.job_type}",
        context=_parent(job.traceparent),
        kind=_api.CONSUMER,
        attributes={
            "messaging.system": "sidelinja",
            "messaging.operation.type": "process",
            "messaging.destination.name": job.job_type,
            "messaging.message.id": str(job.id),
            "sidelinja.workspace.id": str(job.workspace_id),
            "sidelinja.job.attempt": job.attempt,
            "sidelinja.job.max_attempts": job.max_attempts,
            "sidelinja.job.pickup_delay_s": max(float(job.waited_s), 0.0),
            "sidelinja.worker.id": str(worker_id),
        },
    )
    return span, _api.attach(_api.set_span_in_context(span))


def end_job_span(
    span: Span, token: object, outcome: str, error: BaseException | None, message: str | None
) -> None:
    """Records the attempt's outcome on `span`, ends it, and makes the task's context what it
    was. A failed attempt (retry, error, timeout) has status error, with the exception."""
    assert _api is not None
    _api.detach(token)
    span.set_attribute("sidelinja.job.outcome", outcome)
    if outcome in FAILED_OUTCOMES:
        if error is not None:
            span.record_exception(error)
        span.set_status(_api.Status(_api.ERROR, message))
    span.end()


def _parent(traceparent: str | None) -> Context | None:
    """The context of the enqueuer's span from the row's `traceparent`; None (a new trace)
    for a missing or invalid one."""
    parsed = parse_traceparent(traceparent)
    if parsed is None:
        return None
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    trace_id, span_id, flags = parsed
    remote = SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(flags & 0xFF))
    return trace.set_span_in_context(NonRecordingSpan(remote))


def current_traceparent() -> str | None:
    """The traceparent of the current span (this task's job or a span a handler made), for a
    job enqueued now; None if there is no valid one."""
    from opentelemetry import trace

    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags) & 0xFF:02x}"


def instrument_http(client: httpx.AsyncClient) -> None:
    """Each request of `client` becomes a client span, child of the current one, and carries
    its traceparent to the outside service."""
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

    HTTPXClientInstrumentor.instrument_client(client, tracer_provider=_provider)
