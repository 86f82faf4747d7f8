"""The commands behind the CLI; each returns the exit code."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import signal
from datetime import UTC, datetime
from typing import Any
from uuid import UUID, uuid4

from sidelinja_worker.cli import admin as admin_cli
from sidelinja_worker.cli import limits as limits_cli
from sidelinja_worker.cli.session import opened, parse_uuid
from sidelinja_worker.jobs.catalog import REGISTRY
from sidelinja_worker.jobs.transcripts import pipeline
from sidelinja_worker.queue import client, embedded, gctune, metrics, migrate, store
from sidelinja_worker.queue.config import SETTINGS, ServiceConfig
from sidelinja_worker.queue.db import (
    connect,
    resolve_database,
    say,
)
from sidelinja_worker.queue.durations import parse_duration_s
from sidelinja_worker.queue.errors import UserError
from sidelinja_worker.queue.settings import WorkerSettings
from sidelinja_worker.queue.why import explain
from sidelinja_worker.queue.worker import EXIT_WORKER_DIED, Worker, WorkerDied


async def dispatch(args: argparse.Namespace) -> int:
    if args.command == "types":
        return show_types()
    if (code := await admin_cli.dispatch(args)) is not None:
        return code
    handlers = {
        "migrate": cmd_migrate,
        "enqueue": cmd_enqueue,
        "run": cmd_run,
        "demo": cmd_demo,
        "workspace": cmd_workspace,
        "jobs": cmd_jobs,
        "limits": cmd_limits,
        "pipeline": cmd_pipeline,
    }
    return await handlers[args.command](args)


async def cmd_migrate(args: argparse.Namespace) -> int:
    db = resolve_database(args.database_url, args.data_dir)
    say(f"sidelinja-worker: {db.describe()}")
    conn = await connect(db.url, timeout=10)
    try:
        if args.check:
            missing = await migrate.pending(conn)
            for m in missing:
                print(f"pending: {m.version:04d}_{m.name}")
            if not missing:
                print("up to date")
            return 1 if missing else 0
        applied = await migrate.apply_all(conn)
    finally:
        await conn.close()
    for m in applied:
        print(f"applied: {m.version:04d}_{m.name}")
    if not applied:
        print("up to date")
    return 0


def show_types() -> int:
    print(f"{'JOB TYPE':<28} {'PRIORITY':>8} {'TIMEOUT':>8}  NEEDS")
    for jt in REGISTRY.values():
        needs = ", ".join(jt.needs_settings) or "-"
        print(f"{jt.name:<28} {jt.default_priority:>8} {jt.timeout_s:>7g}s  {needs}")
        print(f"    {jt.description}")
    return 0


async def cmd_enqueue(args: argparse.Namespace) -> int:
    job = parse_new_job(args)
    async with opened(args) as (_db, pool):
        if not await store.workspace_exists(pool, UUID(str(job.workspace_id))):
            raise UserError(
                f"no workspace {job.workspace_id}: create it with "
                f"`sidelinja-worker workspace create NAME --id {job.workspace_id}`"
            )
        job_id = await client.enqueue_many(pool, [job])
    print(job_id[0])
    return 0


def parse_new_job(args: argparse.Namespace) -> client.NewJob:
    """The enqueue arguments as a NewJob, or a UserError naming the first bad one."""
    if args.job_type not in REGISTRY:
        raise UserError(f"unknown job type {args.job_type!r}; known: {', '.join(sorted(REGISTRY))}")
    try:
        payload = json.loads(args.payload)
    except json.JSONDecodeError as exc:
        raise UserError(f"--payload is not JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise UserError(f"--payload must be a JSON object, got {type(payload).__name__}")
    workspace = parse_uuid(args.workspace, "--workspace")
    scheduled_for = parse_timestamp(args.at) if args.at else None
    delay_s = parse_duration_s(args.delay) if args.delay else None
    timeout_s = max(1, round(parse_duration_s(args.timeout))) if args.timeout else None
    try:
        return client.NewJob(
            workspace,
            args.job_type,
            payload,
            priority=args.priority,
            scheduled_for=scheduled_for,
            delay_s=delay_s,
            max_attempts=args.max_attempts,
            unique_key=args.unique_key,
            timeout_s=timeout_s,
        ).checked()
    except ValueError as exc:
        raise UserError(str(exc)) from None


def parse_timestamp(text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise UserError(
            f"--at {text!r} is not an ISO 8601 timestamp, e.g. 2026-12-24T18:00"
        ) from None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def worker_settings(args: argparse.Namespace) -> WorkerSettings:
    try:
        max_concurrent = int(args.max_concurrent)
    except ValueError:
        raise UserError(f"--max-concurrent {args.max_concurrent!r} is not a number") from None
    if max_concurrent < 1:
        raise UserError("--max-concurrent must be at least 1")
    types = tuple(t.strip() for t in args.types.split(",") if t.strip())
    unknown = [t for t in types if t not in REGISTRY]
    if unknown:
        raise UserError(
            f"unknown job types in --types: {', '.join(unknown)}; "
            f"known: {', '.join(sorted(REGISTRY))}"
        )
    lease_s = _duration(args.lease, "--lease", MAX_LEASE_S)
    if lease_s < 1:
        raise UserError("--lease must be at least 1s")
    return WorkerSettings(
        max_concurrent=max_concurrent,
        poll_interval_s=max(_duration(args.poll_interval, "--poll-interval", 3600), 0.01),
        job_types=types,
        burst=args.burst,
        lease_s=lease_s,
        grace_s=_duration(args.grace, "--grace", MAX_SETTING_S),
        listen=not args.no_listen,
        max_timeout_s=max(_duration(args.max_timeout, "--max-timeout", MAX_SETTING_S), 0.001),
        keep_completed_s=_duration(args.keep_completed, "--keep-completed", MAX_SETTING_S),
        keep_errors_s=_duration(args.keep_errors, "--keep-errors", MAX_SETTING_S),
    )


MAX_LEASE_S = 86400.0  # a lease longer than a day would leave a dead worker's jobs for days
MAX_SETTING_S = 100 * 365 * 86400.0  # beyond any sensible setting, within PostgreSQL's interval


def _duration(text: str, flag: str, most_s: float) -> float:
    """A duration flag, finite and at most `most_s`: NaN or 1e999s would otherwise reach SQL
    intervals and timers and fail there, far from the flag that caused it."""
    seconds = parse_duration_s(text)
    if not math.isfinite(seconds) or seconds > most_s:
        raise UserError(f"{flag} {text!r} is out of range (at most {most_s:g}s)")
    return seconds


async def cmd_run(args: argparse.Namespace) -> int:
    settings = worker_settings(args)  # bad flags fail before any database work
    async with opened(args, pool_size=5) as (db, pool):
        config = ServiceConfig.from_env(_service_overrides(args))
        worker = Worker(pool, db.url, REGISTRY, settings, config)
        install_stop_signals(worker)
        gctune.tune_for_serving()
        if args.metrics_port:  # the server lives on this loop until the process ends
            host = os.environ.get("SIDELINJA_METRICS_BIND") or metrics.DEFAULT_HOST
            await metrics.serve(pool, args.metrics_port, host)
            worker.supervise_also("metrics", lambda: metrics.gauge_loop(pool))
        try:
            await worker.run()
        except WorkerDied as exc:
            # Crash-only: out now, whatever a stuck handler or connection would make an orderly
            # exit wait for; what the worker could give back it has, the leases cover the rest.
            say(f"sidelinja-worker: error: {exc}; exiting with code {EXIT_WORKER_DIED}")
            logging.shutdown()
            embedded.release()
            os._exit(EXIT_WORKER_DIED)
    return 0


def install_stop_signals(worker: Worker) -> None:
    """First SIGTERM/SIGINT: graceful stop. Second: exit at once (leases cover the jobs)."""
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        if worker.stopping:
            say(f"sidelinja-worker: second {signal.Signals(signum).name}: exiting now")
            embedded.release()  # os._exit skips the exit handlers that would stop it
            os._exit(1)
        worker.request_stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)


async def cmd_workspace(args: argparse.Namespace) -> int:
    workspace_id = parse_uuid(args.id, "--id") if args.id else uuid4()
    async with opened(args) as (_db, pool):
        await store.ensure_workspace(pool, workspace_id, args.name)
    print(workspace_id)
    return 0


async def cmd_jobs(args: argparse.Namespace) -> int:
    job_id = parse_uuid(args.job_id, "job id")
    async with opened(args) as (_db, pool):
        if args.jobs_command == "why":
            facts = await store.why_facts(pool, job_id)
            if facts is None:
                raise UserError(f"no job {job_id}")
            relatives = await store.job_relatives(pool, job_id)
            for reason in explain({**facts, "parents": _relatives(relatives, "parent")}):
                print(f"- {reason}")
            return 0
        if args.jobs_command == "show":
            row = await store.get_job(pool, job_id)
            if row is None:
                raise UserError(f"no job {job_id}")
            relatives = await store.job_relatives(pool, job_id)
            shown = {
                **row,
                "parents": _relatives(relatives, "parent"),
                "children": _relatives(relatives, "child"),
            }
            print(json.dumps(shown, indent=2, default=_json_default, ensure_ascii=False))
            return 0
        after, before = await store.request_cancel(pool, job_id)
    if before is None:
        raise UserError(f"no job {job_id}")
    if after is None:
        raise UserError(f"job {job_id} is already {before}; nothing to cancel")
    print(
        "cancel requested: the running handler is being stopped"
        if before == "running"
        else "cancelled"
    )
    return 0


async def cmd_pipeline(args: argparse.Namespace) -> int:
    """`pipeline episode`: the episode's whole pipeline as one graph; prints each job's id."""
    owner, _, repo = args.repo.partition("/")
    if not owner or not repo:
        raise UserError(f"--repo must be OWNER/REPO, got {args.repo!r}")
    episode = pipeline.Episode(
        workspace_id=parse_uuid(args.workspace, "--workspace"),
        audio_path=args.audio,
        owner=owner,
        repo=repo,
        transcript_ref=args.ref,
        srt_path=args.srt_path,
        branch=args.branch,
        language=args.language,
        title=args.title,
        embed=not args.no_embed,
    )
    async with opened(args) as (_db, pool):
        if not await store.workspace_exists(pool, episode.workspace_id):
            raise UserError(f"no workspace {episode.workspace_id}")
        try:
            ids = await pipeline.enqueue_episode(pool, episode)
        except ValueError as exc:
            raise UserError(str(exc)) from None
    for job_type, job_id in ids.items():
        print(f"{job_type} {job_id}")
    return 0


def _relatives(rows: list[Any], relation: str) -> list[dict[str, Any]]:
    """A job's parents or children in a graph: id, type, status, run_anyway."""
    return [
        {k: r[k] for k in ("id", "job_type", "status", "run_anyway")}
        for r in rows
        if r["relation"] == relation
    ]


def _service_overrides(args: argparse.Namespace) -> dict[str, str | None]:
    return {s.env: getattr(args, f"service_{s.env}", None) for s in SETTINGS}


def _json_default(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


async def cmd_limits(args: argparse.Namespace) -> int:
    async with opened(args) as (_db, pool):
        return await limits_cli.run(args, pool)


async def cmd_demo(args: argparse.Namespace) -> int:
    from sidelinja_worker.cli.demo import run_demo

    async with opened(args, pool_size=5) as (db, pool):
        return await run_demo(db, pool, ServiceConfig.from_env(_service_overrides(args)))
