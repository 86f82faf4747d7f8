"""The benchmark, one command:

    python bench/run.py [--jobs 20000] [--database-url URL]

Creates throwaway databases on the server at URL (default: DATABASE_URL, else the local
PostgreSQL), measures, drops them, prints one markdown table and writes it to
bench/results/latest.md. bench/README.md says what each row means."""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from dataclasses import dataclass
from uuid import UUID, uuid4

import asyncpg
import bare_loop
import baseline
import claim_latency
import peers
import sidelinja_bench as sw
from common import DEFAULT_URL, RESULTS_DIR, Latency, create_database, drop_database
from cpu import CpuSplit, ServerCpu, median_split
from procmem import Memory
from report import Row, document

from sidelinja_worker.queue.db import connect

CONCURRENCIES = (1, 10, 50)
# Drains as a user runs the worker, beside the tuned ones above (logging at warning): the CLI's
# default log level at concurrency 50, and `sidelinja-worker run` with no flags at all
# (concurrency 3, poll 1 s, log info, status events "auto": sent only while a listener holds a
# lease, and none does here).
DEFAULT_CONCURRENCY = 3
AS_RUN = ((50, "info"), (DEFAULT_CONCURRENCY, "info"))
TARGET_LOG_COST = 0.05  # the default log level costs at most 5 % of the c=50 drain
TARGET_ENQUEUE_PER_S = 30_000
TARGET_DRAIN_50_PER_S = 25_000
TARGET_IDLE_MB = 60
TARGET_DRAINING_MB = 120
TARGET_CLAIM_GROWTH = 2.0
TARGET_PICKUP_P50_MS = 2.0
TARGET_TIMES_PGQUEUER = 5.0
TARGET_PICKUP_P99_MS = 5.0
# Anything else running (a test suite, say) takes CPU from PostgreSQL and the worker alike.
# Pairs of fair/plain drains for the 10 % fairness target: with 3 the row missed in 3 of 10 runs on
# 2026-12-03 (-10 to -17 %) while its median over the runs was -6 %.
FAIRNESS_PAIRS = 5
FAIRNESS_WORKSPACES = 10  # the fairness rows deal their jobs over this many workspaces
BUSY_LOAD = len(os.sched_getaffinity(0)) / 2
# Drains per concurrency, per batch size of the bare loop and of PGQueuer: one drain of 20,000
# jobs lasts about a second, and on this shared 2-core VM one second can be 25 % slower than the
# next, so each row is a median. They run in rounds (drain_rounds), so a slow minute falls on
# every one of them alike.
DRAIN_RUNS = 5  # odd: each median is one run; five, as three let one slow minute decide a ratio
# Runs on an empty queue whose CPU (start-up, shutdown) is taken off each drain's.
EMPTY_RUNS = 3


@dataclass(frozen=True)
class Ours:
    enqueue_per_s: list[float]
    drains: list[sw.Drain]  # DRAIN_RUNS per concurrency
    seed_per_s: float
    seed_wall_s: float
    idle: Memory
    latency: Latency
    insert_round_trip: Latency  # the single INSERTs' own round trips, seen by the inserter
    claims: list[claim_latency.ClaimTiming]
    plan_summary: str
    # (fair, plain) jobs/s of alternating concurrency-50 drains with fairness on and off, for
    # the 10 % fairness target: one pair is within the machine's noise, so the row takes the medians.
    fairness_pairs: list[tuple[float, float]]
    empty_run: CpuSplit  # median CPU of a worker's run on an empty queue

    def median_drain(self, concurrency: int, log_level: str = "warning") -> sw.Drain:
        """The drain with the median jobs/s at `concurrency` (DRAIN_RUNS is odd)."""
        runs = sorted(self.at(concurrency, log_level), key=lambda d: d.jobs_per_s)
        return runs[len(runs) // 2]

    def range_at(self, concurrency: int, log_level: str = "warning") -> tuple[float, float]:
        rates = [d.jobs_per_s for d in self.at(concurrency, log_level)]
        return min(rates), max(rates)

    def at(self, concurrency: int, log_level: str) -> list[sw.Drain]:
        return [d for d in self.drains if d.concurrency == concurrency and d.log_level == log_level]


def say(line: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


async def drain_rounds(
    conn: asyncpg.Connection,
    url: str,
    workspace_id: UUID,
    bare_url: str,
    pgqueuer: peers.PgqueuerRuns,
    n: int,
    server: ServerCpu | None,
) -> tuple[list[float], list[sw.Drain], list[bare_loop.BareRun], list[peers.PeerRun]]:
    """The drains the targets compare, in DRAIN_RUNS rounds of: ours at each concurrency, the
    bare loop at each batch size, PGQueuer. This VM's speed moves within minutes; in rounds, a
    slow minute falls on all of them alike instead of on whichever ran then. Returns our
    enqueue rates, our drains, the bare loop's and PGQueuer's."""
    rates: list[float] = []
    drains: list[sw.Drain] = []
    bare: list[bare_loop.BareRun] = []
    pgq: list[peers.PeerRun] = []
    for round_ in range(1, DRAIN_RUNS + 1):
        runs = [(c, "warning") for c in CONCURRENCIES] + list(AS_RUN)
        if round_ % 2 == 0:  # the info/warning pair at 50 in the other order: no order effect
            runs[CONCURRENCIES.index(50)], runs[len(CONCURRENCIES)] = (
                runs[len(CONCURRENCIES)],
                runs[CONCURRENCIES.index(50)],
            )
        for concurrency, level in runs:
            say(
                f"round {round_}: sidelinja-worker: enqueue {n}, drain at concurrency "
                f"{concurrency}, log {level}"
            )
            await sw.empty_queue(conn)
            since = await sw.server_now(conn)
            rates.append(await sw.enqueue(conn, workspace_id, n))
            await sw.refresh_statistics(conn)
            drains.append(await sw.drain(conn, url, concurrency, since, server, log_level=level))
        for batch in bare_loop.BATCHES:
            say(f"round {round_}: bare batched loop on the seed's table, B = {batch}")
            bare.append(await bare_loop.drain(bare_url, n, batch, server))
        say(f"round {round_}: PGQueuer 1.6 drain")
        pgq.append(await pgqueuer.drain(n))
    return rates, drains, bare, pgq


async def measure_ours(
    conn: asyncpg.Connection,
    url: str,
    dbname: str,
    workspace_id: UUID,
    n: int,
    rates: list[float],
    drains: list[sw.Drain],
    empty_run: CpuSplit,
) -> Ours:
    """Everything of ours but the drain rounds: fairness, the seed's loop, idle memory and
    pickup, claim latency."""
    spread = await sw.more_workspaces(conn, FAIRNESS_WORKSPACES)
    fairness_pairs = [
        (
            await _drain_with_fairness(conn, url, spread, n, True, rates),
            await _drain_with_fairness(conn, url, spread, n, False, rates),
        )
        for _ in range(FAIRNESS_PAIRS)
    ]
    say("seed loop baseline (3 slots)")
    seed_per_s, seed_wall_s, seed_enqueue_per_s = await _seed(conn, url, workspace_id, n)
    rates.append(seed_enqueue_per_s)
    say("sidelinja-worker: idle memory and pickup latency")
    idle, latency, insert_round_trip = await sw.idle_and_latency(conn, url, dbname, workspace_id)
    say(
        "claim latency at 10k / 10k + 1M completed / 1M pending / 100, 1 of 10,000 and "
        "1,000 of 10,000 workspaces (the slow part)"
    )
    plan_file = RESULTS_DIR / "claim_plan_1m.txt"
    claims, summary = await claim_latency.measure(conn, workspace_id, plan_file)
    return Ours(
        rates,
        drains,
        seed_per_s,
        seed_wall_s,
        idle,
        latency,
        insert_round_trip,
        claims,
        summary,
        fairness_pairs,
        empty_run,
    )


async def _drain_with_fairness(
    conn: asyncpg.Connection,
    url: str,
    workspace_ids: list[UUID],
    n: int,
    fair: bool,
    enqueue_rates: list[float],
) -> float:
    """jobs/s of a concurrency-50 drain of jobs spread over several workspaces, with the queue
    setting fair_workspaces on (the default: the fair claim) or off (the plain claim): what
    fairness costs when no limit is configured. Several workspaces, because with one the fair
    claim takes the plain claim's path. Its enqueue's rate goes to `enqueue_rates`."""
    say(
        f"sidelinja-worker: enqueue {n}, drain at concurrency 50, fairness {'on' if fair else 'off'}"
    )
    await conn.execute("UPDATE queue_settings SET value = $1 WHERE name = 'fair_workspaces'", fair)
    try:
        await sw.empty_queue(conn)
        since = await sw.server_now(conn)
        enqueue_rates.append(await sw.enqueue(conn, workspace_ids, n))
        await sw.refresh_statistics(conn)
        return (await sw.drain(conn, url, 50, since)).jobs_per_s
    finally:
        await conn.execute(
            "UPDATE queue_settings SET value = 'true' WHERE name = 'fair_workspaces'"
        )


async def _seed(
    conn: asyncpg.Connection, url: str, workspace_id: UUID, n: int
) -> tuple[float, float, float]:
    """(jobs/s, wall s, jobs/s of its enqueue) of the seed's loop on fresh jobs."""
    await sw.empty_queue(conn)
    since = await sw.server_now(conn)
    enqueue_per_s = await sw.enqueue(conn, workspace_id, n)
    await sw.refresh_statistics(conn)
    run = await baseline.drain(url)
    jobs, span_s = await sw.drain_span(conn, since)
    return jobs / span_s, run.wall_s, enqueue_per_s


async def run_all(admin_url: str, n: int) -> str:
    tag = uuid4().hex[:8]
    names = {part: f"bench_{tag}_{part}" for part in ("sw", "bare", "procrastinate", "pgqueuer")}
    created: list[str] = []
    try:
        urls = {}
        for part, name in names.items():
            urls[part] = await create_database(admin_url, name)
            created.append(name)
        conn = await connect(urls["sw"])
        pgqueuer = await peers.PgqueuerRuns.open(urls["pgqueuer"])
        try:
            workspace_id = await sw.prepare(conn)
            await sw.warm_up(conn, workspace_id)
            server = await ServerCpu.locate(conn)
            say(f"CPU of {EMPTY_RUNS} runs on an empty queue each: sidelinja-worker, PGQueuer")
            empty_run = median_split(
                [await sw.drain_nothing(conn, urls["sw"], server) for _ in range(EMPTY_RUNS)]
            )
            pgqueuer_empty_run = median_split(
                [await pgqueuer.drain_nothing() for _ in range(EMPTY_RUNS)]
            )
            rates, drains, bare, pgqueuer_runs = await drain_rounds(
                conn, urls["sw"], workspace_id, urls["bare"], pgqueuer, n, server
            )
            ours = await measure_ours(
                conn, urls["sw"], names["sw"], workspace_id, n, rates, drains, empty_run
            )
            say("procrastinate 3.10")
            procrastinate = await peers.run_procrastinate(urls["procrastinate"], n)
            say("PGQueuer 1.6: pickup latency")
            pgq_latency = await pgqueuer.latency(sw.LATENCY_JOBS, sw.LATENCY_GAP_S)
        finally:
            await pgqueuer.close()
            await conn.close()
        pg_version = await _server_version(admin_url)
    finally:
        for name in created:
            await drop_database(admin_url, name)
    table_rows = rows(ours, bare, [[procrastinate], pgqueuer_runs], pgq_latency, pgqueuer_empty_run)
    return document("sidelinja-worker benchmark", table_rows, pg_version, notes(ours, n))


async def _server_version(url: str) -> str:
    conn = await asyncpg.connect(url)
    try:
        return await conn.fetchval("SHOW server_version")
    finally:
        await conn.close()


def _rate(per_s: float) -> str:
    return f"{per_s:,.0f} jobs/s"


def _mb(kb: int) -> float:
    return kb / 1024


def rows(
    ours: Ours,
    bare: list[bare_loop.BareRun],
    peer_runs: list[list[peers.PeerRun]],
    pgq_latency: Latency,
    pgqueuer_empty_run: CpuSplit,
) -> list[Row]:
    return [
        *_throughput_rows(ours),
        *_bare_rows(ours, bare),
        *_peer_rows(ours, bare, peer_runs),
        *_cpu_rows(ours, bare, peer_runs[-1], pgqueuer_empty_run),
        *_latency_rows(ours, pgq_latency),
        *_memory_rows(ours),
        *_claim_rows(ours),
    ]


def _cpu_rows(
    ours: Ours,
    bare: list[bare_loop.BareRun],
    pgqueuer_runs: list[peers.PeerRun],
    pgqueuer_empty_run: CpuSplit,
) -> list[Row]:
    """Where the drains' CPU went: the queue's process and the server, µs per job."""
    top = max(bare_loop.BATCHES)
    parts = [
        (
            "sidelinja-worker at concurrency 50, log info (default)",
            [d.cpu.less(ours.empty_run) for d in ours.at(50, "info")],
            [d.jobs for d in ours.at(50, "info")],
        ),
        (
            "sidelinja-worker at concurrency 50, log warning",
            [d.cpu.less(ours.empty_run) for d in ours.at(50, "warning")],
            [d.jobs for d in ours.at(50, "warning")],
        ),
        (
            f"the bare loop at B = {top:,}",
            [r.cpu for r in bare if r.batch == top],
            [r.jobs for r in bare if r.batch == top],
        ),
        (
            "PGQueuer",
            [r.cpu.less(pgqueuer_empty_run) for r in pgqueuer_runs if r.cpu],
            [r.jobs for r in pgqueuer_runs if r.cpu],
        ),
    ]
    described = []
    for name, splits, jobs in parts:
        per_job = [
            CpuSplit(s.client_s / j * 1e6, s.server_s / j * 1e6 if s.server_s is not None else None)
            for s, j in zip(splits, jobs)
        ]
        m = median_split(per_job)
        if m.server_s is None:
            described.append(
                f"{name}: its process {m.client_s:.1f} µs (PostgreSQL not on this machine)"
            )
        else:
            described.append(
                f"{name}: its process {m.client_s:.1f} µs + PostgreSQL "
                f"{m.server_s:.1f} µs = {m.client_s + m.server_s:.1f} µs"
            )
    return [Row("CPU per job in the drains above, medians [g]", "; ".join(described))]


def _bare_rows(ours: Ours, bare: list[bare_loop.BareRun]) -> list[Row]:
    """The issue's yardstick per batch size, and the worker's c=50 drain as a share of it."""
    ours_50 = ours.median_drain(50).jobs_per_s
    out = []
    for batch in bare_loop.BATCHES:
        rates = sorted(r.jobs_per_s for r in bare if r.batch == batch)
        median = statistics.median(rates)
        out.append(
            Row(
                f"Yardstick: bare batched loop on the seed's table, B = {batch:,}, median "
                f"of {len(rates)} [f]",
                f"{_rate(median)} (range {rates[0]:,.0f}–{rates[-1]:,.0f}); "
                f"sidelinja-worker at concurrency 50 = {ours_50 / median:.0%} of it",
            )
        )
    return out


def _throughput_rows(ours: Ours) -> list[Row]:
    rates = sorted(ours.enqueue_per_s)
    median = rates[len(rates) // 2]
    out = [
        Row(
            f"Bulk enqueue, `enqueue_many` of N noop jobs (median of {len(rates)})",
            f"{_rate(median)} (range {rates[0]:,.0f}–{rates[-1]:,.0f})",
            f"≥ {TARGET_ENQUEUE_PER_S:,}/s",
            median >= TARGET_ENQUEUE_PER_S,
        ),
        *_as_run_rows(ours),
    ]
    for concurrency in CONCURRENCIES:
        d = ours.median_drain(concurrency)
        low, high = ours.range_at(concurrency)
        target_met = (d.jobs_per_s >= TARGET_DRAIN_50_PER_S) if d.concurrency == 50 else None
        out.append(
            Row(
                f"Drain, sidelinja-worker, concurrency {d.concurrency}, log warning (tuned), "
                f"median of {DRAIN_RUNS}",
                f"{_rate(d.jobs_per_s)} (range {low:,.0f}–{high:,.0f}; wall "
                f"{d.wall_s:.1f} s incl. start-up)",
                f"≥ {TARGET_DRAIN_50_PER_S:,}/s" if d.concurrency == 50 else "",
                target_met,
            )
        )
    fair = statistics.median(f for f, _ in ours.fairness_pairs)
    plain = statistics.median(p for _, p in ours.fairness_pairs)
    out.append(
        Row(
            f"Drain, concurrency 50, fairness off (plain claim), median of "
            f"{len(ours.fairness_pairs)}, {FAIRNESS_WORKSPACES} workspaces [e]",
            f"{_rate(plain)}; fairness on (default), median of "
            f"{len(ours.fairness_pairs)}: {_rate(fair)}, {fair / plain - 1:+.0%}",
            "fair within 10 %",
            fair >= 0.9 * plain,
        )
    )
    return out


def _as_run_rows(ours: Ours) -> list[Row]:
    """The drains with the worker's defaults, first: what a user who changes nothing gets."""
    d = ours.median_drain(DEFAULT_CONCURRENCY, "info")
    low, high = ours.range_at(DEFAULT_CONCURRENCY, "info")
    info = ours.median_drain(50, "info")
    tuned = ours.median_drain(50)
    # Drains of one round ran back to back: their ratio is the like-for-like figure.
    pairs = [
        i.jobs_per_s / w.jobs_per_s
        for i, w in zip(ours.at(50, "info"), ours.at(50, "warning"), strict=True)
    ]
    cost = 1 - statistics.median(pairs)
    return [
        Row(
            f"Drain with the defaults: `sidelinja-worker run` (concurrency {DEFAULT_CONCURRENCY}, "
            f"log info, status events auto), median of {DRAIN_RUNS}",
            f"{_rate(d.jobs_per_s)} (range {low:,.0f}–{high:,.0f})",
        ),
        Row(
            f"Drain, concurrency 50, default log level (info), median of {DRAIN_RUNS} [h]",
            f"{_rate(info.jobs_per_s)}; the tuned drain (log warning) below: "
            f"{_rate(tuned.jobs_per_s)}; info costs {cost:.1%} (median of the rounds' ratios)",
            f"≤ {TARGET_LOG_COST:.0%}",
            cost <= TARGET_LOG_COST,
        ),
    ]


def _peer_rows(
    ours: Ours, bare: list[bare_loop.BareRun], peer_runs: list[list[peers.PeerRun]]
) -> list[Row]:
    """One row per peer: its median drain when it ran several (PGQueuer), else its one. Each
    row also gives the issue's bare loop (at its largest batch) as a multiple of the peer: the
    issue took 35,000-40,000/s against PGQueuer's ~5,000 when it set the 5x target, so this
    says whether 5x is within that loop's reach in the run at hand."""
    out = [
        Row(
            "Baseline: the seed's loop, 1 job per transaction, 3 slots",
            f"{_rate(ours.seed_per_s)} (wall {ours.seed_wall_s:.1f} s)",
        )
    ]
    # The target is set for the defaults (log level info), so the multiple is of that drain;
    # the tuned one (warning) is given beside it.
    ours_50 = ours.median_drain(50, "info").jobs_per_s
    tuned_50 = ours.median_drain(50).jobs_per_s
    top = max(bare_loop.BATCHES)
    bare_top = statistics.median(r.jobs_per_s for r in bare if r.batch == top)
    for runs in peer_runs:
        ordered = sorted(runs, key=lambda r: r.jobs_per_s)
        p = ordered[len(ordered) // 2]
        several = f", median of {len(runs)}" if len(runs) > 1 else ""
        spread = (
            f"range {ordered[0].jobs_per_s:,.0f}–{ordered[-1].jobs_per_s:,.0f}; "
            if len(runs) > 1
            else ""
        )
        stopped = f", stopped after {p.jobs:,} jobs at the time limit" if p.stopped else ""
        times = ours_50 / p.jobs_per_s
        how = ""
        # A peer drained once per round is compared round by round, as the log cost is: the
        # machine's speed drifts between rounds, and a ratio within a round shares its minute.
        ours_rounds = ours.at(50, "info")
        if len(runs) > 1 and len(runs) == len(ours_rounds):
            ratios = [o.jobs_per_s / r.jobs_per_s for o, r in zip(ours_rounds, runs, strict=True)]
            times = statistics.median(ratios)
            how = (
                f" (median of the rounds' ratios, {', '.join(f'{x:.1f}' for x in ratios)};"
                f" of the medians {ours_50 / p.jobs_per_s:.1f}×)"
            )
        pgqueuer = p.name.startswith("PGQueuer")
        out.append(
            Row(
                f"Drain, {p.name} ({p.settings}){several} [a]",
                f"{_rate(p.jobs_per_s)} ({spread}wall {p.wall_s:.1f} s{stopped}; its bulk "
                f"enqueue {p.enqueue_per_s:,.0f}/s; peak RSS {_mb(p.peak_kb):.0f} MB); "
                f"sidelinja-worker at concurrency 50, defaults = {times:.1f}× it{how}; log "
                f"warning: {tuned_50 / p.jobs_per_s:.1f}×; the bare loop at B = {top:,}: "
                f"{bare_top / p.jobs_per_s:.1f}×",
                f"≥ {TARGET_TIMES_PGQUEUER:g}×" if pgqueuer else "",
                times >= TARGET_TIMES_PGQUEUER if pgqueuer else None,
            )
        )
    return out


def _latency_rows(ours: Ours, pgq: Latency) -> list[Row]:
    def fmt(lat: Latency) -> str:
        return f"p50 {lat.p50_ms:.1f} ms, p99 {lat.p99_ms:.1f} ms ({lat.jobs} jobs)"

    met = (
        ours.latency.p50_ms <= TARGET_PICKUP_P50_MS and ours.latency.p99_ms <= TARGET_PICKUP_P99_MS
    )
    return [
        Row(
            "Pickup latency while idle, sidelinja-worker (single plain-SQL INSERTs) [b]",
            fmt(ours.latency),
            f"p50 ≤ {TARGET_PICKUP_P50_MS:g} ms, p99 ≤ {TARGET_PICKUP_P99_MS:g} ms",
            met,
        ),
        Row("Pickup latency while idle, PGQueuer 1.6 (single enqueues) [b]", fmt(pgq)),
        Row(
            "The same single INSERTs' own round trip, as the inserter saw it [b]",
            f"p50 {ours.insert_round_trip.p50_ms:.1f} ms, p99 "
            f"{ours.insert_round_trip.p99_ms:.1f} ms",
        ),
    ]


def _memory_rows(ours: Ours) -> list[Row]:
    idle_mb = _mb(ours.idle.hwm_kb)
    drain_mb = _mb(max(d.peak_kb for d in ours.drains if d.concurrency == 50))
    return [
        Row(
            "Worker peak RSS, idle after start-up [c]",
            f"{idle_mb:.1f} MB",
            f"≤ {TARGET_IDLE_MB} MB",
            idle_mb <= TARGET_IDLE_MB,
        ),
        Row(
            "Worker peak RSS, draining at concurrency 50 [c]",
            f"{drain_mb:.1f} MB",
            f"≤ {TARGET_DRAINING_MB} MB",
            drain_mb <= TARGET_DRAINING_MB,
        ),
    ]


def _claim_rows(ours: Ours) -> list[Row]:
    """One row per table shape, each claim variant side by side, growth against 10k."""
    labels = list(dict.fromkeys(c.label for c in ours.claims))
    base = {c.variant: c.median_ms for c in ours.claims if c.label == labels[0]}
    out = []
    for label in labels:
        timings = [c for c in ours.claims if c.label == label]
        growth = {c.variant: c.median_ms / base[c.variant] for c in timings}
        grown = "1M" in label  # the rows the flat-claim target is about
        result = "; ".join(
            f"{c.variant} {c.median_ms:.2f} ms (p90 {c.p90_ms:.2f})"
            + (f" = {growth[c.variant]:.1f}×" if grown else "")
            for c in timings
        )
        out.append(
            Row(
                f"Claim of {claim_latency.CLAIM_LIMIT}, {label}, median [d]",
                result,
                f"≤ {TARGET_CLAIM_GROWTH:g}× 10k" if grown else "",
                max(growth.values()) <= TARGET_CLAIM_GROWTH if grown else None,
            )
        )
    return out


def notes(ours: Ours, n: int) -> list[str]:
    return [
        f"N = {n:,} noop jobs per drain. Drain throughput = N / (max(completed_at) − "
        "min(started_at)) read from the table, so process start-up is excluded; wall time is "
        "process spawn to exit. Each sidelinja drain is one worker process (in-process "
        "`Worker`, pool 5 as `sidelinja-worker run`, `--burst`, poll 1 s, logging at "
        "WARNING as with `--log-level warning` unless the row says info) on an emptied table, "
        "after "
        "`ANALYZE job_queue` (what autovacuum does shortly after a bulk insert). "
        "Enqueue time is the `enqueue_many` call only, on a warm connection.",
        "[a] Each peer in its own fresh database and worker process, after ANALYZE; "
        "throughput from its own timestamps: procrastinate, first 'started' to last "
        "'succeeded' in procrastinate_events; PGQueuer, first 'picked' to last 'successful' "
        "in pgqueuer_log. Both stamp now() of the writing transaction, as job_queue does. "
        f"A peer still running after {peers.PEER_TIME_LIMIT_S:.0f} s is stopped by SIGTERM "
        "and measured on the jobs it finished. The baseline runs in the benchmark process "
        "(asyncpg, 3 connections) on the same job_queue table, after ANALYZE.",
        "[b] A worker at concurrency 50, poll interval 1 s (so LISTEN/NOTIFY is what is "
        f"measured), idle; then {sw.LATENCY_JOBS} single jobs {sw.LATENCY_GAP_S * 1000:.0f} ms "
        "apart; latency = started_at − created_at (PGQueuer: its 'picked' − 'queued' log "
        "rows), both from the server clock. created_at is the insert's transaction start, so "
        "a pickup includes the insert's own commit (WAL flush) and the wake-up of every "
        "process on the way on an idle 2-core VM; the inserts' round trip row shows that part "
        "alone.",
        "[c] VmHWM of the worker process: idle = read from /proc 1 s after it registered "
        "and LISTENed, before any job; draining = at exit of the c=50 drain.",
        f"[d] plain = `store.claim(conn, worker_id, {claim_latency.CLAIM_LIMIT}, ['noop'])`; "
        "fair = `store.claim_with_limits(..., fair=True, capped=False)`, what a worker runs "
        "by default (one workspace with jobs; the last three rows spread them over 100, add "
        "9,999 idle workspaces, or spread them over 1,000 of those 10,000). Median of "
        f"{claim_latency.SAMPLES} after {claim_latency.WARM_UP} warm-up claims, each in a "
        "transaction rolled back, with generic plans as the worker's claim pool has them; rows "
        "filled by generate_series, then VACUUM ANALYZE. "
        "EXPLAIN (ANALYZE, BUFFERS) at 1M pending in bench/results/claim_plan_1m.txt; "
        f"indexes the generic plans use: {ours.plan_summary}.",
        f"[e] {FAIRNESS_PAIRS} more pairs of concurrency-50 drains of N jobs dealt over "
        f"{FAIRNESS_WORKSPACES} workspaces, alternating `queue_settings.fair_workspaces` on "
        "(the default: the fair claim) and off (the plain claim). Several workspaces because "
        "with one the fair claim takes the plain claim's path (the drains above). The target is "
        "that, with no limit configured, throughput stay within 10 % of the plain claim's.",
        "[f] bench/bare_loop.py, in its own database with the seed's table only (no triggers, "
        "one index): one asyncio process claims B jobs per statement, runs each as a task, and "
        "completes them with one `unnest` statement on a second connection while the next "
        "claim is on the wire; no leases, retries, limits, fairness, events or validation. "
        "It was measured at ~28,000 (B=200) and 35,000–40,000 jobs/s (B=1,000) on this "
        "machine when it was written: the ratio to it says how fast the machine is today.",
        "[g] CPU seconds from /proc, per job, median over the drain rounds: the queue's own "
        "process while it ran (a worker child: its run, imports excluded; the bare loop: the "
        "benchmark process during the loop) and the PostgreSQL server (the postmaster, its "
        "live children and, through its cutime/cstime, the backends that exited). For a worker "
        f"child, the median of {EMPTY_RUNS} runs on an empty queue (connections, prepared "
        "statements, registration, shutdown) is taken off. The server shares these 2 cores, "
        "so a drain that keeps both busy runs at about 2 / (total CPU per job): a drain N "
        "times another's needs about 1/N of its CPU per job.",
        "[h] The CLI's default log level, info, in the same rounds as the tuned drains: JSON "
        "lines to a file (bench/results/worker_child.log), as a worker under a process "
        "manager writes to a pipe. info logs start, stop, every failure, retry, deferral and "
        "rescue, and a summary of completions per type every 10 s; a success's own line is "
        "debug. The cost is the median of each round's info/warning ratio.",
    ]


def busy_warning(load_before: float) -> str:
    if load_before <= BUSY_LOAD:
        return ""
    return " — **the machine was busy before the run: these numbers understate the queue**"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000, help="N per drain (20000)")
    parser.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL") or DEFAULT_URL,
        help="a server where we may create databases [env DATABASE_URL]",
    )
    args = parser.parse_args()
    RESULTS_DIR.mkdir(exist_ok=True)
    load_before = os.getloadavg()[0]
    if load_before > BUSY_LOAD:
        say(f"warning: load average {load_before:.1f} before the run; the numbers will be low")
    started = time.perf_counter()
    text = asyncio.run(run_all(args.database_url, args.jobs))
    text += (
        f"\nWhole run: {time.perf_counter() - started:.0f} s. Load average (1 min) "
        f"{load_before:.2f} before, {os.getloadavg()[0]:.2f} after"
        f"{busy_warning(load_before)}.\n"
    )
    (RESULTS_DIR / "latest.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
