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
the bounded queue dropped.

    python bench/tracing_cost.py --instructions [--jobs 5000] [--base-tree /tmp/base]

counts instead, under callgrind, the instructions the executor spends on a noop job with
tracing off, in-process (no database: outcomes are left with the outcome writer), for this tree
and the base one: the same code gives the same count whatever else the machine does, so a
difference of a fraction of a percent shows. Each count is a run of N jobs less a run of none
(start-up, imports), divided by N."""

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
from common import create_database, drain_parser, drop_database
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


async def executor_loop(n: int, made: int) -> None:
    """Runs `n` noop jobs through executor.execute, as a slot does, with tracing as the
    environment leaves it (off here). `made` jobs are made either way, so that a run of none
    less a run of `n` counts only the executor."""
    from uuid import UUID

    from sidelinja_worker.jobs import noop
    from sidelinja_worker.queue import executor
    from sidelinja_worker.queue.config import ServiceConfig
    from sidelinja_worker.queue.context import Services
    from sidelinja_worker.queue.jobs import ClaimedJob
    from sidelinja_worker.queue.outcomes import OutcomeWriter

    worker_id = UUID(int=1)
    writer = OutcomeWriter(None, worker_id)  # type: ignore[arg-type]  # never flushed here
    services = Services(None, None, ServiceConfig({}), None)  # type: ignore[arg-type]
    space = UUID(int=2)
    jobs = [ClaimedJob(UUID(int=10 + i), space, "noop", {}, 0, 1, 3, None) for i in range(made)]
    for job in jobs[:n]:
        await executor.execute(job, noop.JOB_TYPE, writer, services, worker_id, 60.0, {})


def instructions(n: int, base_tree: Path | None) -> None:
    trees: list[tuple[str, dict[str, str]]] = [("this tree, tracing off", {})]
    if base_tree is not None:
        trees.append(("base tree", {"PYTHONPATH": str(base_tree)}))
    for name, env in trees:
        counts = [_callgrind(jobs, n, env) for jobs in (0, n)]
        print(f"{name:24}: {(counts[1] - counts[0]) / n:,.0f} instructions per job ({n:,} jobs)")


def _callgrind(n: int, made: int, env: dict[str, str]) -> int:
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "callgrind.out"
        subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable,
             __file__, "--executor-loop", str(n), "--jobs", str(made)],
            # A fixed hash seed: the same dict and set work in every run.
            env={k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
            | {"PYTHONHASHSEED": "0"} | env,
            check=True, capture_output=True,
        )  # fmt: skip
        for line in out.read_text().splitlines():
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise RuntimeError("callgrind wrote no summary")


def main() -> None:
    parser = drain_parser(__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--base-tree", type=Path, help="an earlier commit's tree, for 'base'")
    parser.add_argument("--instructions", action="store_true", help="callgrind, the executor")
    parser.add_argument("--executor-loop", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.executor_loop is not None:
        asyncio.run(executor_loop(args.executor_loop, args.jobs))
        return
    if args.instructions:
        instructions(args.jobs, args.base_tree)
        return
    asyncio.run(
        measure(args.database_url, args.jobs, args.rounds, args.concurrency, args.base_tree)
    )


if __name__ == "__main__":
    main()
