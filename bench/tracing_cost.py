"""What tracing costs a drain, in the same run: tracing off (the default), tracing on (every
job's span exported over OTLP/HTTP to a receiver in this process), and, given the tree of an
earlier commit, that code with no tracing in it at all:

    git archive BASE_COMMIT | (mkdir -p /tmp/base && tar -x -C /tmp/base)
    python bench/tracing_cost.py [--jobs 20000] [--rounds 5] [--concurrency 50] \\
        [--base-tree /tmp/base] [--database-url URL]

Rounds of burst drains of N fresh noop jobs by one worker process per variant, the variants'
order rotating from round to round, so that a slow minute of a shared machine falls on all
alike; prints each drain and the medians of jobs/s and of the worker's CPU per job (its
start-up and shutdown, measured once per variant on an empty queue, taken off). The "base"
variant runs this bench's worker child with PYTHONPATH at the given tree, on the database this
tree migrated (the extra column is nothing to it). Absolute figures move with the machine's
load; the ratios are the result. With tracing on, the receiver's count of spans says how many
the bounded queue dropped."""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from uuid import uuid4

import asyncpg
import sidelinja_bench as sw
from common import DEFAULT_URL, create_database, drop_database
from cpu import CpuSplit, ServerCpu, run_measured
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from sidelinja_worker.queue.db import connect


class Receiver(BaseHTTPRequestHandler):
    """An OTLP/HTTP trace endpoint that counts the spans it is sent."""

    spans = 0
    lock = threading.Lock()

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        export = ExportTraceServiceRequest.FromString(body)
        count = sum(len(s.spans) for r in export.resource_spans for s in r.scope_spans)
        with Receiver.lock:
            Receiver.spans += count
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def receiving() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@dataclass(frozen=True)
class Variant:
    name: str
    env: dict[str, str]


@contextmanager
def environment(env: dict[str, str]) -> Iterator[None]:
    """The worker child inherits this process's environment: `env` on top, no other OTEL_*."""
    saved = dict(os.environ)
    for key in [k for k in os.environ if k.startswith("OTEL_")]:
        del os.environ[key]
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@dataclass(frozen=True)
class Run:
    drain: sw.Drain
    cpu_us: float  # the worker's CPU per job, start-up and shutdown taken off
    spans: int


async def measure(
    admin_url: str, n: int, rounds: int, concurrency: int, base_tree: Path | None
) -> None:
    name = f"bench_{uuid4().hex[:8]}_tracing"
    url = await create_database(admin_url, name)
    try:
        conn = await connect(url)
        try:
            with receiving() as endpoint:
                variants = [
                    Variant("off", {}),
                    Variant("on", {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}),
                ]
                if base_tree is not None:
                    variants.append(Variant("base", {"PYTHONPATH": str(base_tree)}))
                runs = await _rounds(conn, url, variants, n, rounds, concurrency)
        finally:
            await conn.close()
    finally:
        await drop_database(admin_url, name)
    _report(runs, n, rounds, concurrency)


async def _rounds(
    conn: asyncpg.Connection,
    url: str,
    variants: list[Variant],
    n: int,
    rounds: int,
    concurrency: int,
) -> dict[str, list[Run]]:
    workspace_id = await sw.prepare(conn)
    await sw.warm_up(conn, workspace_id)
    server = await ServerCpu.locate(conn)
    idle: dict[str, CpuSplit] = {}
    for v in variants:  # start-up and shutdown: imports, the tracer provider, connections
        await sw.empty_queue(conn)
        with environment(v.env):
            idle[v.name] = (await run_measured(conn, server, "worker_child.py", url, "50"))[3]
    runs: dict[str, list[Run]] = {v.name: [] for v in variants}
    for i in range(rounds):
        for v in variants[i % len(variants) :] + variants[: i % len(variants)]:
            await sw.empty_queue(conn)
            since = await sw.server_now(conn)
            await sw.enqueue(conn, workspace_id, n)
            await sw.refresh_statistics(conn)
            before = Receiver.spans
            with environment(v.env):
                d = await sw.drain(conn, url, concurrency, since, server)
            cpu_us = (d.cpu.client_s - idle[v.name].client_s) / d.jobs * 1e6
            run = Run(d, cpu_us, Receiver.spans - before)
            runs[v.name].append(run)
            print(
                f"round {i + 1} {v.name:4}: {d.jobs_per_s:8,.0f} jobs/s, worker {cpu_us:5.1f} "
                f"µs/job, {run.spans:,} spans received",
                file=sys.stderr,
                flush=True,
            )
    return runs


def _report(runs: dict[str, list[Run]], n: int, rounds: int, concurrency: int) -> None:
    rate = {k: statistics.median(r.drain.jobs_per_s for r in v) for k, v in runs.items()}
    cpu = {k: statistics.median(r.cpu_us for r in v) for k, v in runs.items()}
    spans = {k: statistics.median(r.spans for r in v) for k, v in runs.items()}
    lines = [
        f"{rounds} rounds of {n:,} noop jobs at concurrency {concurrency}, load average "
        f"{os.getloadavg()[0]:.1f} at the end"
    ]
    for k in runs:
        lines.append(
            f"  {k:4}: {rate[k]:8,.0f} jobs/s, worker {cpu[k]:5.1f} µs/job, "
            f"{spans[k]:,.0f} spans received (median)"
        )
    for k, against in (("off", "base"), ("on", "off")):
        if k in runs and against in runs:
            ratios = [
                a.drain.jobs_per_s / b.drain.jobs_per_s
                for a, b in zip(runs[k], runs[against], strict=True)
            ]
            lines.append(
                f"  {k} / {against}: jobs/s {rate[k] / rate[against] - 1:+.1%} (medians), median "
                f"of the rounds' ratios {statistics.median(ratios) - 1:+.1%}; worker CPU "
                f"{cpu[k] - cpu[against]:+.1f} µs/job"
            )
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--base-tree", type=Path, help="an earlier commit's tree, for 'base'")
    parser.add_argument(
        "--database-url", default=os.environ.get("DATABASE_URL", DEFAULT_URL), help="admin URL"
    )
    args = parser.parse_args()
    asyncio.run(
        measure(args.database_url, args.jobs, args.rounds, args.concurrency, args.base_tree)
    )


if __name__ == "__main__":
    main()
