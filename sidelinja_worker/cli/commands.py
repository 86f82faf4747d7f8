"""The commands behind the CLI; each returns the exit code."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import signal
import sys
import textwrap
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import PurePosixPath
from typing import Any
from uuid import UUID, uuid4

import asyncpg
from pydantic import ValidationError

from sidelinja_worker.cli import admin as admin_cli
from sidelinja_worker.cli import bulk, jobids, newjob, progress, retention
from sidelinja_worker.cli import limits as limits_cli
from sidelinja_worker.cli import operator as operator_cli
from sidelinja_worker.cli.session import json_default, opened, parse_uuid, why_not_listening
from sidelinja_worker.jobs.catalog import REGISTRY
from sidelinja_worker.jobs.transcripts import pipeline
from sidelinja_worker.queue import client, embedded, gctune, metrics, migrate, store, threads
from sidelinja_worker.queue.db import (
    connect,
    resolve_database,
    say,
)
from sidelinja_worker.queue.errors import UserError
from sidelinja_worker.queue.escapes import printable, printable_json
from sidelinja_worker.queue.ids import uuid7s
from sidelinja_worker.queue.pools import WORKER_SESSIONS
from sidelinja_worker.queue.why import explain
from sidelinja_worker.queue.worker import EXIT_WORKER_DIED, Worker, WorkerDied


async def dispatch(args: argparse.Namespace) -> int:
    if args.command == "types":
        return show_types()
    if (code := await admin_cli.dispatch(args)) is not None:
        return code
    if (code := await operator_cli.dispatch(args)) is not None:
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
        "prune": retention.run,
    }
    return await handlers[args.command](args)


async def cmd_migrate(args: argparse.Namespace) -> int:
    db = resolve_database(args.settings.database, args.settings.data_dir)
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
        with progress.steps(progress.wanted(args.settings.log_format)) as shown:

            def on_start(position: int, count: int, m: migrate.Migration) -> None:
                shown.start(f"migration {position} of {count}: {m.version:04d}_{m.name}")

            def on_wait() -> None:
                say("sidelinja-worker: waiting for another migrate to finish (advisory lock)")

            applied = await migrate.apply_all(conn, on_start=on_start, on_wait=on_wait)
            shown.finish()
    finally:
        await conn.close()
    for m in applied:
        print(f"applied: {m.version:04d}_{m.name}")
    if not applied:
        print("up to date")
    return 0


TYPES_NEEDS_AT = 48  # the column NEEDS starts at in `types`
# How long a stopped `run` waits for thread work its jobs left running before it exits anyway.
THREAD_WORK_AT_EXIT_S = 5.0


def show_types() -> int:
    """The job types, wrapped to the terminal's width (80 when piped): the descriptions run to
    200 characters, and a line the terminal wraps itself breaks the table's columns."""
    width = shutil.get_terminal_size().columns
    print(f"{'JOB TYPE':<28} {'PRIORITY':>8} {'TIMEOUT':>8}  NEEDS")
    for jt in REGISTRY.values():
        needs = _wrapped(", ".join(jt.needs_settings) or "-", width - TYPES_NEEDS_AT, "")
        print(f"{jt.name:<28} {jt.default_priority:>8} {jt.timeout_s:>7g}s  {needs[0]}")
        for more in needs[1:]:
            print(" " * TYPES_NEEDS_AT + more)
        for line in _wrapped(jt.description, width, "    "):
            print(line)
    return 0


def _wrapped(text: str, width: int, indent: str) -> list[str]:
    """`text` in lines of at most `width` (at least 20), broken between words only."""
    return textwrap.wrap(
        text,
        max(width, 20),
        initial_indent=indent,
        subsequent_indent=indent,
        break_long_words=False,
        break_on_hyphens=False,
    ) or [indent]


async def cmd_enqueue(args: argparse.Namespace) -> int:
    if args.file is not None:
        return await bulk.run(args)
    job = newjob.from_flags(args)
    async with opened(args) as (_db, pool):
        if not await store.workspace_exists(pool, UUID(str(job.workspace_id))):
            raise UserError(
                f"no workspace {job.workspace_id}: create it with "
                f"`sidelinja-worker workspace create NAME --id {job.workspace_id}`"
            )
        # An id given in advance tells a new job from one deduplicated onto its key's holder.
        job = replace(job, job_id=uuid7s(1)[0])
        try:
            (job_id,) = await client.enqueue_many(pool, [job])
        except client.UniqueKeyUnresolved as exc:  # a race with the key's holders: try again
            raise UserError(f"--unique-key: {exc}; nothing was enqueued") from None
        if job_id != job.job_id:
            await say_held(pool, args.unique_key, job_id)
    print(job_id)
    if job_id != job.job_id:  # the holder's settings and schedule are not this command's
        return 0
    if job.scheduled_for is not None and job.scheduled_for < datetime.now(UTC):
        say(f"sidelinja-worker: warning: --at {args.at} is in the past; the job is due now")
    newjob.warn_missing_settings(args, {job.job_type})
    return 0


async def say_held(pool: asyncpg.Pool, unique_key: str, holder: UUID) -> None:
    """One line on stderr: the id printed is the job holding the key, of whatever job type."""
    row = await store.get_job(pool, holder)
    what = f" ({printable(row['job_type'])}, {row['status']})" if row else ""
    say(
        f"sidelinja-worker: --unique-key {printable(repr(unique_key))} is held by job "
        f"{holder}{what}: that is the id printed; nothing new was enqueued"
    )


async def cmd_run(args: argparse.Namespace) -> int:
    settings = args.settings.worker_settings(tuple(REGISTRY))  # bad flags fail before the database
    async with opened(args, pool_size=5, settings=WORKER_SESSIONS) as (db, pool):
        config = args.settings.service_config()
        worker = Worker(pool, db.url, REGISTRY, settings, config)
        install_stop_signals(worker)
        gctune.tune_for_serving()
        if port := args.settings.metrics_port:  # the server lives on this loop until the end
            try:
                await metrics.serve(pool, port, args.settings.metrics_bind)
            except OSError as exc:  # the gauges' own database errors are handled inside
                raise UserError(f"--metrics-port {port}: {why_not_listening(exc)}") from None
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
    if left := await threads.wait_idle(THREAD_WORK_AT_EXIT_S):
        # Work a job's timeout could not stop (a call that never returns) still holds a thread:
        # asyncio's shutdown and the interpreter's exit would wait for it for ever, and a
        # `run --burst` from cron never ended. Every job is written or given back by now.
        say(
            f"sidelinja-worker: {left} thread(s) of handler work still running after"
            f" {THREAD_WORK_AT_EXIT_S:g} s (a blocking call that outlived its job); exiting"
            " without them"
        )
        logging.shutdown()
        embedded.release()
        sys.stdout.flush()
        os._exit(0)
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
    if args.workspace_command == "list":
        async with opened(args) as (_db, pool):
            rows = await admin_cli.workspaces(pool)
        for r in rows:
            print(f"{r['id']}  {printable(r['name'])}")  # any writer may have set it
        if not rows:
            say("no workspaces yet: `sidelinja-worker workspace create NAME`")
        return 0
    if not args.name.strip():  # `workspace list` and the admin view would show nothing
        raise UserError("NAME must not be empty")
    workspace_id = parse_uuid(args.id, "--id") if args.id else uuid4()
    async with opened(args) as (_db, pool):
        if await store.workspace_exists(pool, workspace_id):
            await say_kept(pool, workspace_id)
        else:
            await store.ensure_workspace(pool, workspace_id, args.name)
    print(workspace_id)  # either way: a script that runs it again still reads the id
    return 0


async def say_kept(pool: asyncpg.Pool, workspace_id: UUID) -> None:
    """One line on stderr: the id is taken, and the workspace keeps its own name."""
    name = next(
        (r["name"] for r in await admin_cli.workspaces(pool) if r["id"] == workspace_id), ""
    )
    say(
        f"sidelinja-worker: workspace {workspace_id} already exists, named "
        f"{printable(repr(name))}; left as it is"
    )


async def cmd_jobs(args: argparse.Namespace) -> int:
    ref = jobids.parse(args.job_id)
    async with opened(args) as (_db, pool):
        job_id = await jobids.resolve(pool, ref)
        if args.jobs_command == "why":
            facts = await store.why_facts(pool, job_id)
            if facts is None:
                raise UserError(f"no job {job_id}")
            needs = (
                REGISTRY[facts["job_type"]].needs_settings if facts["job_type"] in REGISTRY else ()
            )
            missing = args.settings.service_config().missing(needs)
            relatives = await store.job_relatives(pool, job_id)
            facts_ = {**facts, "parents": _relatives(relatives, "parent")}
            for reason in explain(facts_, missing) + await _worker_gone(pool, facts):
                print(f"- {printable(reason)}")
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
            for relation, key in (("parent", "more_parents"), ("child", "more_children")):
                more = max((r["more"] for r in relatives if r["relation"] == relation), default=0)
                if more:  # past store.MAX_RELATIVES: counted, not listed
                    shown[key] = more
            text = json.dumps(shown, indent=2, default=json_default, ensure_ascii=False)
            print(printable_json(text))
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


async def _worker_gone(pool: asyncpg.Pool, facts: Any) -> list[str]:
    """For a running row whose worker is gone (its lease expired, or no row at all): the row
    says running while nothing runs the job, until a live worker's rescue puts it back."""
    if facts["status"] != "running":
        return []
    workers = await store.list_workers(pool)
    worker = next((w for w in workers if w["id"] == facts["worker_id"]), None)
    if worker is not None and worker["alive"]:
        return []
    expired = f" (its lease expired at {_at(worker['expires_at'])})" if worker else ""
    gone = f"its worker {facts['worker_id']} is gone{expired}"
    if any(w["alive"] for w in workers):
        return [
            f"{gone}: a live worker's rescue puts the job back in the queue, counted as an attempt"
        ]
    return [
        f"{gone}, and no worker is live to put the job back in the queue: start one with "
        "`sidelinja-worker run`"
    ]


def _at(when: datetime) -> str:
    return f"{when.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"


async def cmd_pipeline(args: argparse.Namespace) -> int:
    """`pipeline episode`: the episode's whole pipeline as one graph; prints each job's id."""
    owner, _, repo = args.repo.partition("/")
    if not owner.strip() or not repo.strip():
        raise UserError(f"--repo must be OWNER/REPO, got {args.repo!r}")
    for flag, value in (("--audio", args.audio), ("--language", args.language)):
        if not value.strip():
            raise UserError(f"{flag} must not be empty")
    # An empty value given from an unset shell variable would otherwise mean the default.
    for flag, value in (
        ("--ref", args.ref),
        ("--srt-path", args.srt_path),
        ("--branch", args.branch),
    ):
        if value is not None and not value.strip():
            raise UserError(f"{flag} must not be empty (leave it out for its default)")
    if args.ref is None and not PurePosixPath(args.audio).stem.strip():
        raise UserError(
            f"--audio {args.audio!r} names no file to name the transcript by: give --ref"
        )
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
    check_episode(episode)
    async with opened(args) as (_db, pool):
        if not await store.workspace_exists(pool, episode.workspace_id):
            raise UserError(f"no workspace {episode.workspace_id}")
        try:
            ids = await pipeline.enqueue_episode(pool, episode)
        except ValueError as exc:
            raise UserError(str(exc)) from None
    for job_type, job_id in ids.items():
        print(f"{job_type} {job_id}")
    newjob.warn_missing_settings(args, ids)
    return 0


# The flag behind each payload field of the episode's jobs, to name it in an error.
EPISODE_FLAGS = {
    "audio_path": "--audio",
    "transcript_ref": "--ref",
    "language": "--language",
    "owner": "--repo",
    "repo": "--repo",
    "path": "--srt-path",
    "branch": "--branch",
    "title": "--title",
}


def check_episode(episode: pipeline.Episode) -> None:
    """Each job of the graph as its handler reads its payload: a value the handler refuses
    fails the whole graph at its first job, so it is refused here, naming the flag."""
    for job in pipeline.episode_jobs(episode):
        try:
            REGISTRY[job.job_type].payload_model.model_validate(dict(job.payload))
        except ValidationError as exc:
            error = exc.errors()[0]
            flag = EPISODE_FLAGS.get(str(error["loc"][-1]), f"{job.job_type} payload")
            raise UserError(f"{flag} {error['input']!r}: {error['msg']}") from None


def _relatives(rows: list[Any], relation: str) -> list[dict[str, Any]]:
    """A job's parents or children in a graph: id, type, status, run_anyway."""
    return [
        {k: r[k] for k in ("id", "job_type", "status", "run_anyway")}
        for r in rows
        if r["relation"] == relation
    ]


async def cmd_limits(args: argparse.Namespace) -> int:
    async with opened(args) as (_db, pool):
        return await limits_cli.run(args, pool)


async def cmd_demo(args: argparse.Namespace) -> int:
    from sidelinja_worker.cli.demo import run_demo

    async with opened(args, pool_size=5) as (db, pool):
        return await run_demo(db, pool, args.settings.service_config())
