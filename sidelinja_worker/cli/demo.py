"""`sidelinja-worker demo`: a newcomer's first run. Enqueues samples of every job type that needs
no outside service (noop probes, srt_parse on a bundled Norwegian SRT, stats_parse on bundled
Caddy logs), runs them live, and prints what they produced. Job types whose services are not
configured are listed with the variables to set. No canned answers."""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any
from uuid import UUID

import asyncpg

from sidelinja_worker.jobs.catalog import REGISTRY
from sidelinja_worker.queue import client, store
from sidelinja_worker.queue.client import NewJob
from sidelinja_worker.queue.config import ServiceConfig
from sidelinja_worker.queue.db import Database
from sidelinja_worker.queue.errors import UserError
from sidelinja_worker.queue.escapes import printable
from sidelinja_worker.queue.settings import WorkerSettings
from sidelinja_worker.queue.worker import EXIT_WORKER_DIED, Worker, WorkerDied

DEMO_WORKSPACE = UUID("00000000-0000-4000-8000-00000000de00")

SAMPLES: list[tuple[str, str, dict[str, Any], dict[str, Any]]] = [
    ("hello", "noop", {"message": "Hei fra Sidelinja!"}, {}),
    ("slow", "noop", {"sleep_ms": 300, "message": "took 300 ms"}, {}),
    ("urgent", "noop", {"message": "priority 10 runs first"}, {"priority": 10}),
    ("flaky", "noop", {"fail": "the service answered 503"}, {"max_attempts": 1}),
    ("bad input", "noop", {"sleep_ms": "soon"}, {}),
    (
        "transcript",
        "srt_parse",
        {"transcript_ref": "demo-episode", "srt_path": "episode_no.srt", "language": "no"},
        {},
    ),
    ("downloads", "stats_parse", {"logs": "access.log", "schedule": False}, {}),
]


async def run_demo(db: Database, pool: asyncpg.Pool, config: ServiceConfig) -> int:
    await refuse_a_database_in_use(pool)
    await store.ensure_workspace(pool, DEMO_WORKSPACE, "Demo")
    jobs = [
        NewJob(DEMO_WORKSPACE, job_type, payload, **opts) for _, job_type, payload, opts in SAMPLES
    ]
    ids = await client.enqueue_many(pool, jobs)
    # A worker logs a completed job at debug (a line per job is noise at scale); the demo is
    # there to watch each job run, so it shows them unless the user asked for less.
    job_log = logging.getLogger("sidelinja_worker.job")
    if job_log.getEffectiveLevel() == logging.INFO:
        job_log.setLevel(logging.DEBUG)
    print(
        f"enqueued {len(ids)} sample jobs in workspace {DEMO_WORKSPACE}; running them:\n",
        flush=True,
    )
    # Files are confined to MEDIA_ROOT/<workspace id>: the sample files are copied into the
    # demo workspace's folder under a throwaway MEDIA_ROOT.
    died: WorkerDied | None = None
    with tempfile.TemporaryDirectory(prefix="sidelinja-demo-") as media_root:
        with resources.as_file(resources.files("sidelinja_worker.cli") / "demo_data") as data:
            shutil.copytree(data, Path(media_root) / str(DEMO_WORKSPACE))
        config = ServiceConfig({**config.values, "MEDIA_ROOT": media_root})
        worker = Worker(
            pool,
            db.url,
            REGISTRY,
            WorkerSettings(max_concurrent=3, burst=True, poll_interval_s=0.2),
            config,
        )
        try:
            await worker.run()
        except WorkerDied as exc:  # the summary below still shows where every sample got to
            died = exc
    print(
        f"\n{'SAMPLE':<11} {'JOB ID':<36} {'TYPE':<12} {'STATUS':<10} {'TRIES':>5}  RESULT OR ERROR"
    )
    for (label, job_type, _payload, _opts), job_id in zip(SAMPLES, ids, strict=True):
        row = await store.get_job(pool, job_id)
        assert row is not None
        # Any role that writes job_queue can rewrite the demo's rows while it runs (the demo
        # workspace's id is fixed): what they hold prints as text, never as terminal controls.
        outcome = _short(row["result"]) if row["status"] == "completed" else row["error_msg"]
        print(
            f"{label:<11} {job_id!s:<36} {job_type:<12} {row['status']:<10} "
            f"{row['attempts']:>2}/{row['max_attempts']}  {printable(outcome)}"
        )
    if died is not None:
        print(
            f"\nThe worker stopped early: {died}. Samples not finished above go back to the "
            "queue; run the demo again, or `sidelinja-worker run`, to finish them.",
            flush=True,
        )
        return EXIT_WORKER_DIED
    _print_unconfigured(config)
    print(
        "\nNext: `sidelinja-worker types` lists every job type; "
        f"`sidelinja-worker jobs show {ids[0]}` shows one job whole."
    )
    return 0


async def refuse_a_database_in_use(pool: asyncpg.Pool) -> None:
    """A UserError if any job outside the demo's workspace is in the database, embedded or not.
    The demo's worker runs every due job of every type, with a throwaway MEDIA_ROOT, and prunes
    as every worker does: on a database in use it ran, and failed, other workspaces' jobs."""
    others = await pool.fetchval(
        "SELECT EXISTS (SELECT 1 FROM job_queue WHERE workspace_id <> $1)", DEMO_WORKSPACE
    )
    if others:
        raise UserError(
            "demo: this database has jobs outside the demo's workspace, and the demo's worker "
            "would run them too; run the demo on an empty database (unset DATABASE_URL and set "
            "SIDELINJA_DATA_DIR to a new folder for an embedded one)"
        )


def _short(result: Any, width: int = 110) -> str:
    text = json.dumps(result, ensure_ascii=False)
    return text if len(text) <= width else text[: width - 1] + "…"


def _print_unconfigured(config: ServiceConfig) -> None:
    """The job types this demo could not show, and what they need."""
    waiting = [(jt.name, config.missing(jt.needs_settings)) for jt in REGISTRY.values()]
    waiting = [(name, missing) for name, missing in waiting if missing]
    if waiting:
        print("\nNot run here (their outside service is not configured):")
        for name, missing in waiting:
            print(f"  {name:<28} set {', '.join(missing)}")
