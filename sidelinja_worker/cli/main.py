"""`sidelinja-worker`: parses arguments and calls one function in commands.py. Every flag has an
environment variable, named in its help."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import traceback
from collections.abc import Sequence

from sidelinja_worker.cli import admin as admin_cli
from sidelinja_worker.cli import commands
from sidelinja_worker.cli import limits as limits_cli
from sidelinja_worker.queue import logs
from sidelinja_worker.queue.config import SETTINGS
from sidelinja_worker.queue.db import DB_ERRORS
from sidelinja_worker.queue.errors import UserError


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(name, default)


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def _env_flag(name: str) -> bool:
    return (os.environ.get(name) or "").lower() in {"1", "true", "yes", "on"}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sidelinja-worker",
        description="Sidelinja's PostgreSQL job queue and worker. With no DATABASE_URL, every "
        "command uses an embedded PostgreSQL in SIDELINJA_DATA_DIR.",
    )
    parser.add_argument(
        "--database-url",
        default=_env("DATABASE_URL"),
        help="PostgreSQL URL [env DATABASE_URL]; unset: the embedded database",
    )
    parser.add_argument(
        "--data-dir",
        default=_env("SIDELINJA_DATA_DIR"),
        help="data folder of the embedded database [env SIDELINJA_DATA_DIR]",
    )
    parser.add_argument(
        "--debug",
        action="store_true",
        default=_env_flag("SIDELINJA_DEBUG"),
        help="show tracebacks and debug logs [env SIDELINJA_DEBUG=1]",
    )
    parser.add_argument(
        "--log-level",
        type=str.upper,
        choices=LOG_LEVELS,
        default=(_env("SIDELINJA_LOG_LEVEL") or "").upper() or None,
        help="debug, info (default; a line per job), warning or error [env SIDELINJA_LOG_LEVEL]",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("migrate", help="apply the schema migrations")
    p.add_argument(
        "--check", action="store_true", help="apply nothing; exit 1 while any migration is pending"
    )

    p = sub.add_parser("enqueue", help="enqueue one job and print its id")
    p.add_argument("job_type", metavar="JOB_TYPE")
    p.add_argument("--workspace", required=True, help="workspace id (UUID)")
    p.add_argument("--payload", default="{}", help="the payload, a JSON object (default {})")
    p.add_argument("--priority", type=int, help="default: the job type's (see `types`)")
    when = p.add_mutually_exclusive_group()
    when.add_argument("--in", dest="delay", metavar="DURATION", help="run after, e.g. 10m")
    when.add_argument("--at", metavar="TIMESTAMP", help="run at, ISO 8601 (UTC if no zone)")
    p.add_argument("--max-attempts", type=int, default=3)
    p.add_argument("--unique-key", help="dedupe: reuse a queued/running job with this key")
    p.add_argument("--timeout", metavar="DURATION", help="override the job type's timeout")

    p = sub.add_parser("run", help="run jobs")
    p.add_argument(
        "--metrics-port",
        type=int,
        default=_env("SIDELINJA_METRICS_PORT"),
        help="serve Prometheus /metrics on this port [env SIDELINJA_METRICS_PORT] (off)",
    )
    p.add_argument(
        "--max-concurrent",
        default=_env("SIDELINJA_MAX_CONCURRENT", "3"),
        help="handlers at once in this process [env SIDELINJA_MAX_CONCURRENT] (3)",
    )
    p.add_argument(
        "--poll-interval",
        default=_env("SIDELINJA_POLL_INTERVAL", "1s"),
        help="poll this often besides LISTEN [env SIDELINJA_POLL_INTERVAL] (1s)",
    )
    p.add_argument(
        "--types",
        default=_env("SIDELINJA_TYPES", ""),
        help="comma-separated job types to run [env SIDELINJA_TYPES] (all)",
    )
    p.add_argument(
        "--burst",
        action="store_true",
        default=_env_flag("SIDELINJA_BURST"),
        help="exit 0 once no due job is left [env SIDELINJA_BURST=1]",
    )
    p.add_argument(
        "--lease",
        default=_env("SIDELINJA_LEASE", "60s"),
        help="a dead worker's jobs return after this [env SIDELINJA_LEASE] (60s)",
    )
    p.add_argument(
        "--grace",
        default=_env("SIDELINJA_GRACE", "30s"),
        help="on SIGTERM, wait this long for running jobs [env SIDELINJA_GRACE] (30s)",
    )
    p.add_argument(
        "--no-listen",
        action="store_true",
        default=_env_flag("SIDELINJA_NO_LISTEN"),
        help="poll only, for transaction-mode poolers [env SIDELINJA_NO_LISTEN=1]",
    )
    p.add_argument(
        "--max-timeout",
        default=_env("SIDELINJA_MAX_TIMEOUT", "6h"),
        help="cap on any job's timeout override [env SIDELINJA_MAX_TIMEOUT] (6h)",
    )
    p.add_argument(
        "--keep-completed",
        default=_env("SIDELINJA_KEEP_COMPLETED", "14d"),
        help="prune completed jobs older than this [env SIDELINJA_KEEP_COMPLETED] (14d)",
    )
    p.add_argument(
        "--keep-errors",
        default=_env("SIDELINJA_KEEP_ERRORS", "90d"),
        help="prune errored jobs older than this [env SIDELINJA_KEEP_ERRORS] (90d)",
    )
    add_service_flags(p)

    sub.add_parser("types", help="list the job types, their default priority and settings")
    add_service_flags(
        sub.add_parser("demo", help="enqueue sample jobs, run them live, print a summary")
    )

    p = sub.add_parser("workspace", help="workspaces (jobs belong to one)")
    wsub = p.add_subparsers(dest="workspace_command", required=True, metavar="ACTION")
    w = wsub.add_parser("create", help="create a workspace and print its id")
    w.add_argument("name")
    w.add_argument("--id", help="use this UUID (default: a new one)")

    p = sub.add_parser("jobs", help="look at and steer jobs")
    jsub = p.add_subparsers(dest="jobs_command", required=True, metavar="ACTION")
    j = jsub.add_parser("show", help="one job, whole, as JSON")
    j.add_argument("job_id", metavar="ID")
    j = jsub.add_parser("cancel", help="cancel a queued job, or ask a running one to stop")
    j.add_argument("job_id", metavar="ID")
    j = jsub.add_parser("why", help="why a job is not running (yet)")
    j.add_argument("job_id", metavar="ID")
    admin_cli.add_jobs_commands(jsub)

    p = sub.add_parser("pipeline", help="enqueue a built-in job graph")
    psub = p.add_subparsers(dest="pipeline_command", required=True, metavar="PIPELINE")
    e = psub.add_parser(
        "episode",
        help="whisper_transcribe -> srt_parse -> openrouter_analyze (+ generate_embeddings)",
    )
    e.add_argument("--workspace", required=True, metavar="ID")
    e.add_argument("--audio", required=True, metavar="PATH", help="the audio, under MEDIA_ROOT")
    e.add_argument(
        "--repo",
        default="sidelinja/transcripts",
        metavar="OWNER/REPO",
        help="the Forgejo repository the SRT is committed to (default: sidelinja/transcripts)",
    )
    e.add_argument("--ref", help="the transcript's ref (default: the audio's file name)")
    e.add_argument("--srt-path", help="in the repository (default: transcripts/REF.srt)")
    e.add_argument("--branch", help="(default: the repository's default branch)")
    e.add_argument("--language", default="no")
    e.add_argument("--title", help="the episode's working title, for the analysis")
    e.add_argument("--no-embed", action="store_true", help="skip generate_embeddings")

    limits_cli.add_command(sub)
    admin_cli.add_commands(sub)
    return parser


def add_service_flags(p: argparse.ArgumentParser) -> None:
    """The outside services' settings (DESIGN §6): a flag each, defaulting to its env var.
    A flag left unset keeps the env value; secrets are never echoed in help or errors."""
    group = p.add_argument_group("outside services")
    for setting in SETTINGS:
        group.add_argument(
            setting.flag,
            dest=f"service_{setting.env}",
            metavar="VALUE",
            default=None,
            help=f"{setting.help} [env {setting.env}]",
        )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.log_level is not None and args.log_level not in LOG_LEVELS:  # from the env var
        print(
            f"sidelinja-worker: error: SIDELINJA_LOG_LEVEL must be one of "
            f"{', '.join(LOG_LEVELS).lower()}, not {args.log_level.lower()!r}",
            file=sys.stderr,
        )
        return 2
    logging.basicConfig(
        level=args.log_level or ("DEBUG" if args.debug else "INFO"),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
    )
    logs.setup()
    try:
        return asyncio.run(commands.dispatch(args))
    except UserError as exc:
        if args.debug:
            traceback.print_exc()
        print(f"sidelinja-worker: error: {exc}", file=sys.stderr)
        return 2
    except DB_ERRORS as exc:  # the database went away where no retry loop covers it
        if args.debug:
            traceback.print_exc()
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        print(f"sidelinja-worker: error: database: {first}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
