"""OpenTelemetry traces, end to end: a worker process configured by OTEL_* variables exports
to a real OTLP/HTTP receiver on 127.0.0.1 that decodes the protobuf. The job's span joins the
trace of the traceparent a plain SQL insert wrote; the handler's HTTP call is its child and
carries the trace to the outside service; follow-up jobs stay in the trace. A malformed
traceparent starts a new trace and never fails a job; with no OTEL_* set nothing is sent,
nothing of OpenTelemetry is even imported; a collector that never answers does not hold up
the worker."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import AsyncIterator
from uuid import UUID

import asyncpg
import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.sdk.trace import TracerProvider

from sidelinja_worker.jobs import noop
from sidelinja_worker.queue import client, executor, tracing
from sidelinja_worker.queue.client import NewJob
from sidelinja_worker.queue.config import ServiceConfig
from sidelinja_worker.queue.context import Services
from sidelinja_worker.queue.jobs import ClaimedJob
from sidelinja_worker.queue.outcomes import OutcomeWriter
from tests.fakes.otlp_receiver import OtlpReceiver, ReceivedSpan, silent_collector
from tests.fakes.serve import serve
from tests.helpers import SPAWNED, Spawned, insert_jobs

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


# `sidelinja-worker` with the test types registered, as `run` builds it from the catalog.
WORKER = """
import sys
from sidelinja_worker.jobs import catalog
from sidelinja_worker.queue.registry import Registry
from tests.fakes.otlp_job_types import TEST_TYPES
catalog.REGISTRY = Registry([*catalog.REGISTRY.values(), *TEST_TYPES])
from sidelinja_worker.cli.main import main
code = main(sys.argv[1:])
print("opentelemetry imported:", any(m.startswith("opentelemetry") for m in sys.modules))
sys.exit(code)
"""
# The same, on a machine without the OpenTelemetry packages.
WITHOUT_OTEL = "import sys; sys.modules['opentelemetry'] = None\n" + WORKER


async def run_burst_process(
    db_url: str, otel: dict[str, str], script: str = WORKER, timeout_s: float = 90
) -> tuple[str, str, float]:
    """`run --burst` as a process with exactly the OTEL_* variables `otel` (none inherited);
    (stdout, stderr, seconds to its exit). Exit code 0 is asserted."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(DATABASE_URL=db_url, SIDELINJA_LOG_FORMAT="text", **otel)
    began = time.monotonic()
    proc = Spawned([sys.executable, "-c", script, "run", "--burst"], env)
    SPAWNED.append(proc)
    out, err = await asyncio.to_thread(proc.communicate, timeout_s)
    assert proc.returncode == 0, err
    return out, err, time.monotonic() - began


def otel_env(endpoint: str, **more: str) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_SERVICE_NAME": "worker-under-test",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        **more,
    }


@pytest.fixture
async def receiver() -> AsyncIterator[OtlpReceiver]:
    fake = OtlpReceiver()
    async with serve(fake.app()) as url:
        fake.url = url
        yield fake


class OutsideService:
    """An outside service that records the traceparent of each request."""

    def __init__(self) -> None:
        self.traceparents: list[str | None] = []
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.traceparents.append(request.headers.get("traceparent"))
        return web.json_response({"ok": True})


@pytest.fixture
async def outside() -> AsyncIterator[OutsideService]:
    service = OutsideService()
    app = web.Application()
    app.router.add_get("/thing", service.handle)
    async with serve(app) as url:
        service.url = f"{url}/thing"
        yield service


async def insert_traced(
    pool: asyncpg.Pool, workspace: UUID, job_type_name: str, payload: str, traceparent: str | None
) -> UUID:
    """A job as the web app inserts it: plain SQL, with a traceparent of its choosing."""
    return await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload, max_attempts, traceparent)"
        " VALUES ($1, $2, $3::text::jsonb, 1, $4) RETURNING id",
        workspace,
        job_type_name,
        payload,
        traceparent,
    )


def one(spans: list[ReceivedSpan]) -> ReceivedSpan:
    assert len(spans) == 1, spans
    return spans[0]


# -- end to end ---------------------------------------------------------------------------------


async def test_a_job_span_joins_the_enqueuers_trace_with_its_http_call_and_follow_ups(
    pool: asyncpg.Pool,
    db_url: str,
    workspace: UUID,
    receiver: OtlpReceiver,
    outside: OutsideService,
) -> None:
    payload = f'{{"url": "{outside.url}"}}'
    job_id = await insert_traced(pool, workspace, "traced_call", payload, TRACEPARENT)
    broken_id = await insert_traced(pool, workspace, "traced_broken", "{}", None)
    slow_id = await insert_traced(pool, workspace, "traced_slow", "{}", TRACEPARENT)
    later_id = await insert_traced(pool, workspace, "traced_later", "{}", TRACEPARENT)
    _, err, _ = await run_burst_process(db_url, otel_env(receiver.url))
    assert "tracing on: spans to otlp" in err

    job = one(receiver.of_job(job_id))
    assert (job.trace_id, job.parent_span_id) == (TRACE_ID, PARENT_ID)
    assert (job.name, job.kind, job.status) == ("process traced_call", "consumer", "unset")
    attributes = job.attributes
    assert attributes["messaging.destination.name"] == "traced_call"
    assert attributes["sidelinja.workspace.id"] == str(workspace)
    assert attributes["messaging.message.id"] == str(job_id)
    assert attributes["messaging.operation.type"] == "process"
    assert attributes["messaging.system"] == "sidelinja"
    worker = await pool.fetchval("SELECT worker_id FROM job_queue WHERE id = $1", job_id)
    assert attributes["sidelinja.worker.id"] == str(worker)
    assert (attributes["sidelinja.job.attempt"], attributes["sidelinja.job.max_attempts"]) == (1, 1)
    assert attributes["sidelinja.job.outcome"] == "completed"
    started, scheduled = await pool.fetchrow(
        "SELECT started_at, scheduled_for FROM job_queue WHERE id = $1", job_id
    )
    delay_s = attributes["sidelinja.job.pickup_delay_s"]
    assert delay_s == pytest.approx((started - scheduled).total_seconds(), abs=1e-3)
    assert job.resource["service.name"] == "worker-under-test"

    # The outside call: a client span under the job's, whose context the service received.
    http = one([s for s in receiver.spans if s.kind == "client"])
    assert (http.trace_id, http.parent_span_id) == (TRACE_ID, job.span_id)
    assert http.attributes.get("http.request.method", http.attributes.get("http.method")) == "GET"
    assert outside.traceparents == [f"00-{TRACE_ID}-{http.span_id}-01"]

    # The follow-up and the child: their rows carry the job's context, their spans the trace.
    rows = await pool.fetch(
        "SELECT id, traceparent FROM job_queue WHERE job_type = 'traced_next' ORDER BY id"
    )
    assert len(rows) == 2
    assert {r["traceparent"] for r in rows} == {f"00-{TRACE_ID}-{job.span_id}-01"}
    for row in rows:
        follow = one(receiver.of_job(row["id"]))
        assert (follow.trace_id, follow.parent_span_id) == (TRACE_ID, job.span_id)
        assert follow.attributes["sidelinja.job.outcome"] == "completed"

    # A failed attempt: status error, the exception recorded; a row without traceparent is
    # the root of a trace of its own.
    broken = one(receiver.of_job(broken_id))
    assert broken.parent_span_id == "" and broken.trace_id != TRACE_ID
    assert (broken.status, broken.attributes["sidelinja.job.outcome"]) == ("error", "error")
    assert "ValueError: the handler is broken" in broken.status_message
    exception = one([e for e in broken.events if e.name == "exception"])
    assert exception.attributes["exception.type"] == "ValueError"
    slow = one(receiver.of_job(slow_id))
    assert (slow.status, slow.attributes["sidelinja.job.outcome"]) == ("error", "timeout")
    assert slow.status_message == "TimeoutError: timed out after 0.2 s"
    later = one(receiver.of_job(later_id))
    assert (later.status, later.attributes["sidelinja.job.outcome"]) == ("unset", "deferred")
    assert later.trace_id == TRACE_ID


MALFORMED = [
    "",
    "garbage",
    TRACEPARENT.upper(),  # hex is lowercase
    f"00-{'0' * 32}-{PARENT_ID}-01",  # all-zero trace id
    f"00-{TRACE_ID}-{'0' * 16}-01",  # all-zero span id
    f"ff-{TRACE_ID}-{PARENT_ID}-01",  # version ff is invalid, other versions unknown here
    f"01-{TRACE_ID}-{PARENT_ID}-01",
    f"{TRACEPARENT}-extra",  # version 00 has exactly four fields
    f" {TRACEPARENT}",
    f"00-{TRACE_ID}-{PARENT_ID}-0g",
    f"00_{TRACE_ID}_{PARENT_ID}_01",
    "x" * 256,  # the most the column takes
]


async def test_a_malformed_traceparent_starts_a_new_trace_and_the_job_runs(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, receiver: OtlpReceiver
) -> None:
    ids = [await insert_traced(pool, workspace, "noop", "{}", bad) for bad in MALFORMED]
    await run_burst_process(db_url, otel_env(receiver.url))
    statuses = await pool.fetch("SELECT status::text FROM job_queue WHERE id = ANY($1)", ids)
    assert [r[0] for r in statuses] == ["completed"] * len(MALFORMED)
    spans = [one(receiver.of_job(job_id)) for job_id in ids]
    assert all(s.parent_span_id == "" and s.trace_id != TRACE_ID for s in spans)
    assert len({s.trace_id for s in spans}) == len(MALFORMED)  # each a trace of its own


async def test_a_giant_traceparent_is_refused_by_the_table(
    pool: asyncpg.Pool, workspace: UUID
) -> None:
    with pytest.raises(asyncpg.CheckViolationError):
        await insert_traced(pool, workspace, "noop", "{}", "x" * 257)


async def test_off_by_default_nothing_is_sent_nor_imported(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, receiver: OtlpReceiver
) -> None:
    await insert_traced(pool, workspace, "noop", "{}", TRACEPARENT)
    out, err, _ = await run_burst_process(db_url, {"OTEL_SERVICE_NAME": "no-exporter-asked"})
    assert "opentelemetry imported: False" in out and "tracing" not in err
    # Turned off explicitly, whatever endpoint is set.
    for off in ({"OTEL_TRACES_EXPORTER": "none"}, {"OTEL_SDK_DISABLED": "true"}):
        await insert_traced(pool, workspace, "noop", "{}", TRACEPARENT)
        out, _, _ = await run_burst_process(db_url, otel_env(receiver.url, **off))
        assert "opentelemetry imported: False" in out
    assert await pool.fetchval("SELECT count(*) FROM job_queue WHERE status = 'completed'") == 3
    assert receiver.requests == 0


async def test_without_the_packages_the_worker_says_so_and_runs(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, receiver: OtlpReceiver
) -> None:
    await insert_jobs(pool, workspace, 3)
    _, err, _ = await run_burst_process(db_url, otel_env(receiver.url), script=WITHOUT_OTEL)
    assert "OpenTelemetry is not installed" in err and "sidelinja-worker[otel]" in err
    assert await pool.fetchval("SELECT count(*) FROM job_queue WHERE status = 'completed'") == 3
    assert receiver.requests == 0


async def test_a_collector_that_never_answers_does_not_hold_up_the_worker(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """Exports wait up to 30 s for an answer here, on the exporter's thread; the jobs run
    meanwhile, spans past the bounded queue are dropped, and the worker stops after at most
    SHUTDOWN_FLUSH_S of flushing."""
    await insert_jobs(pool, workspace, 500)
    async with silent_collector() as url:
        env = otel_env(
            url, OTEL_EXPORTER_OTLP_TIMEOUT="30", OTEL_BSP_MAX_QUEUE_SIZE="64"
        )  # fmt: skip
        _, err, took_s = await run_burst_process(db_url, env)
    assert await pool.fetchval("SELECT count(*) FROM job_queue WHERE status = 'completed'") == 500
    assert took_s < 20, f"{took_s:.1f} s"
    assert "spans not sent within 5 s of stopping are dropped" in err


async def test_a_collector_that_refuses_connections_does_not_hold_up_the_worker(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    async with silent_collector() as url:
        pass  # closed: its port now refuses connections
    await insert_jobs(pool, workspace, 200)
    _, _, took_s = await run_burst_process(db_url, otel_env(url))
    assert await pool.fetchval("SELECT count(*) FROM job_queue WHERE status = 'completed'") == 200
    assert took_s < 20, f"{took_s:.1f} s"


# -- the client: an enqueuer's context goes into the row ----------------------------------------


@pytest.fixture
def traced_app(monkeypatch: pytest.MonkeyPatch) -> TracerProvider:
    """This process as an application with OpenTelemetry of its own, enqueueing jobs."""
    monkeypatch.setattr(tracing, "ENABLED", False)
    monkeypatch.setattr(tracing, "_tracer", None)
    provider = TracerProvider()
    tracing.enable(provider)
    return provider


async def test_the_client_writes_the_current_span_as_traceparent(
    pool: asyncpg.Pool, workspace: UUID, traced_app: TracerProvider
) -> None:
    tracer = traced_app.get_tracer("web-app")
    with tracer.start_as_current_span("request") as span:
        ctx = span.get_span_context()
        expected = f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"
        one_id = await client.enqueue(pool, workspace, "noop")
        copied = await client.enqueue_many(pool, [NewJob(workspace, "noop")] * 100)  # by COPY
        own = await client.enqueue(pool, workspace, "noop", traceparent=TRACEPARENT)
        bad = await client.enqueue(pool, workspace, "noop", traceparent="00-not-a-trace")
    outside_span = await client.enqueue(pool, workspace, "noop")
    stored = dict(await pool.fetch("SELECT id, traceparent FROM job_queue"))
    assert stored[one_id] == expected
    assert {stored[i] for i in copied} == {expected}
    assert stored[own] == TRACEPARENT
    assert stored[bad] is None and stored[outside_span] is None


async def test_with_tracing_off_the_client_writes_only_a_given_traceparent(
    pool: asyncpg.Pool, workspace: UUID, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tracing, "ENABLED", False)
    plain = await client.enqueue(pool, workspace, "noop")
    given_id = await client.enqueue(pool, workspace, "noop", traceparent=TRACEPARENT)
    stored = dict(await pool.fetch("SELECT id, traceparent FROM job_queue"))
    assert stored == {plain: None, given_id: TRACEPARENT}


# -- the parts ----------------------------------------------------------------------------------


def test_parse_traceparent_takes_version_00_only() -> None:
    assert tracing.parse_traceparent(TRACEPARENT) == (int(TRACE_ID, 16), int(PARENT_ID, 16), 1)
    assert tracing.parse_traceparent(TRACEPARENT[:-2] + "00") == (
        int(TRACE_ID, 16),
        int(PARENT_ID, 16),
        0,
    )
    for bad in [*MALFORMED, None, 42, b"00-" + TRACEPARENT[3:].encode()]:
        assert tracing.parse_traceparent(bad) is None, bad


@given(st.text(max_size=80))
def test_parse_traceparent_never_raises_and_accepts_only_the_exact_form(value: str) -> None:
    parsed = tracing.parse_traceparent(value)
    if parsed is not None:
        assert f"00-{parsed[0]:032x}-{parsed[1]:016x}-{parsed[2]:02x}" == value


@pytest.mark.parametrize(
    "env, exporters",
    [
        ({}, []),
        ({"OTEL_SERVICE_NAME": "x"}, []),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, ["otlp"]),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, ["otlp"]),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "  "}, []),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, ["otlp"]),
        ({"OTEL_TRACES_EXPORTER": "", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"}, ["otlp"]),
        ({"OTEL_TRACES_EXPORTER": "console, OTLP,otlp"}, ["console", "otlp"]),
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, []),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"}, []),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, []),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "false"}, ["otlp"]),
    ],
)
def test_what_turns_tracing_on(env: dict[str, str], exporters: list[str]) -> None:
    assert tracing.wanted_exporters(env) == exporters


@pytest.mark.parametrize("broken", ["start_job_span", "end_job_span"])
async def test_a_failing_tracer_never_fails_a_job(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, broken: str
) -> None:
    def fails(*args: object) -> tuple[object, object]:
        raise RuntimeError("a tracing bug")

    monkeypatch.setattr(tracing, "ENABLED", True)
    monkeypatch.setattr(tracing, "start_job_span", lambda *args: (None, None))
    monkeypatch.setattr(tracing, "end_job_span", lambda *args: None)
    monkeypatch.setattr(tracing, broken, fails)
    worker_id = UUID(int=1)
    job = ClaimedJob(UUID(int=2), UUID(int=3), "noop", {}, 0, 1, 3, None)
    services = Services(None, None, ServiceConfig({}), None)  # type: ignore[arg-type]
    writer = OutcomeWriter(None, worker_id)  # type: ignore[arg-type]
    attempt = await executor.execute(job, noop.JOB_TYPE, writer, services, worker_id, 60, {})
    assert attempt == ("completed", None)
    assert "tracing failed" in caplog.text
