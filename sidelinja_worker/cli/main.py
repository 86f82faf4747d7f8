"""`sidelinja-worker`: parses arguments, loads the settings (sidelinja_worker/settings.py, which
also makes the configuration flags) and calls one function in commands.py."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import select
import sys
import traceback
from collections.abc import Iterator, Sequence
from typing import NoReturn

import asyncpg

from sidelinja_worker import settings
from sidelinja_worker.cli import admin as admin_cli
from sidelinja_worker.cli import bulk, commands, jobids, retention
from sidelinja_worker.cli import limits as limits_cli
from sidelinja_worker.cli import operator as operator_cli
from sidelinja_worker.queue import logs
from sidelinja_worker.queue.db import DB_ERRORS
from sidelinja_worker.queue.errors import UserError
from sidelinja_worker.queue.escapes import printable

EXIT_PIPE_CLOSED = 141  # 128 + SIGPIPE: what a shell reports for a tool whose pipe closed
# Flags whose value may start with "-": argparse would take `--in -5m` for two flags and say
# "expected one argument"; joined as `--in=-5m`, the value reaches its parser, which says why.
VALUE_FLAGS = frozenset(
    {"--in", "--timeout", "--lease", "--grace", "--poll-interval", "--max-timeout"}
    | {"--keep-completed", "--keep-errors", "--max-concurrent", "--max-attempts", "--priority"}
)


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose errors are one line, as every other error of the program is,
    pointing to the help instead of printing the usage (ten lines for `enqueue`) first. The
    subcommands' parsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}; see `{self.prog} --help`\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="sidelinja-worker",
        description="Sidelinja's PostgreSQL job queue and worker. With no DATABASE_URL, every "
        "command uses an embedded PostgreSQL in SIDELINJA_DATA_DIR. Every flag has an "
        "environment variable, named in its help; secrets are environment variables only "
        "(or NAME_FILE=/path).",
    )
    settings.add_flags(parser, settings.GLOBAL)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("migrate", help="apply the schema migrations")
    p.add_argument(
        "--check", action="store_true", help="apply nothing; exit 1 while any migration is pending"
    )

    p = sub.add_parser("enqueue", help="enqueue one job and print its id (or --file: many)")
    p.add_argument("job_type", metavar="JOB_TYPE", nargs="?", help="required without --file")
    p.add_argument("--workspace", help="workspace id (UUID); required without --file")
    p.add_argument("--payload", help="the payload, a JSON object (default {})")
    p.add_argument("--priority", type=int, help="default: the job type's (see `types`)")
    when = p.add_mutually_exclusive_group()
    when.add_argument(
        "--in", dest="delay", metavar="DURATION", help="run after this long, e.g. 90s, 10m, 1h"
    )
    when.add_argument(
        "--at", metavar="TIMESTAMP", help="run at, ISO 8601 (UTC if no zone); a past time warns"
    )
    p.add_argument("--max-attempts", type=int, help="default 3")
    p.add_argument(
        "--unique-key",
        metavar="KEY",
        help="dedupe: while a job of the workspace (any type) is queued or running with this "
        "key, print its id instead of enqueueing",
    )
    p.add_argument(
        "--timeout",
        metavar="DURATION",
        help="override the job type's timeout, e.g. 5m (whole seconds, at least 1s)",
    )
    bulk.add_flags(p)

    p = sub.add_parser("run", help="run jobs until SIGTERM/SIGINT (or --burst)")
    settings.add_flags(p, "run")

    sub.add_parser("types", help="list the job types, their default priority and settings")
    settings.add_flags(
        sub.add_parser("demo", help="enqueue sample jobs, run them live, print a summary"), "demo"
    )

    p = sub.add_parser("workspace", help="workspaces (jobs belong to one)")
    wsub = p.add_subparsers(dest="workspace_command", required=True, metavar="ACTION")
    w = wsub.add_parser("create", help="create a workspace and print its id")
    w.add_argument("name")
    w.add_argument("--id", help="use this UUID (default: a new one)")
    wsub.add_parser("list", help="every workspace: id and name")

    p = sub.add_parser("jobs", help="look at and steer jobs")
    jsub = p.add_subparsers(dest="jobs_command", required=True, metavar="ACTION")
    j = jsub.add_parser("show", help="one job, whole, as JSON")
    j.add_argument("job_id", metavar="ID", help=jobids.HELP)
    j = jsub.add_parser("cancel", help="cancel a queued job, or ask a running one to stop")
    j.add_argument("job_id", metavar="ID", help=jobids.HELP)
    j = jsub.add_parser("why", help="why a job is not running (yet)")
    j.add_argument("job_id", metavar="ID", help=jobids.HELP)
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
    retention.add_command(sub)
    admin_cli.add_commands(sub)
    operator_cli.add_commands(sub)
    # `run --debug` and `jobs list --debug` as well as `--debug run`: every command and every
    # action of one takes the global flags (their defaults are SUPPRESS: no level overrides).
    for command in subcommands(parser):
        settings.add_flags(command, settings.GLOBAL)
    return parser


def subcommands(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """Every parser under `parser`: the commands, and the actions of those that have some."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                yield child
                yield from subcommands(child)


def join_values(argv: Sequence[str]) -> list[str]:
    """`--in -5m` as `--in=-5m` (see VALUE_FLAGS)."""
    out: list[str] = []
    for arg in argv:
        if out and out[-1] in VALUE_FLAGS and arg[:1] == "-" and arg[1:2].isdigit():
            out[-1] = f"{out[-1]}={arg}"
        else:
            out.append(arg)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(join_values(sys.argv[1:] if argv is None else argv))
    try:
        args.settings = settings.load(settings.given_flags(args))
    except UserError as exc:
        error(str(exc))
        return 2
    debug = args.settings.debug
    logging.basicConfig(level=args.settings.level, stream=sys.stderr)
    logs.setup(args.settings.log_format)  # the format: text or JSON lines
    try:
        return asyncio.run(commands.dispatch(args))
    except UserError as exc:
        if debug:
            traceback.print_exc()
        error(str(exc))
        return 2
    except BrokenPipeError as exc:
        if stdout_closed():  # `| head` read what it wanted: not an error, not the database's
            return EXIT_PIPE_CLOSED
        return database_error(exc, debug)
    except DB_ERRORS as exc:  # the database went away where no retry loop covers it
        return database_error(exc, debug)
    except asyncpg.InsufficientPrivilegeError as exc:  # a role without the owner's rights
        if debug:
            traceback.print_exc()
        first = str(exc).strip().splitlines()[0]
        error(f"database: {first}; the CLI runs as the schema owner")
        return 2
    except KeyboardInterrupt:
        return 130


def database_error(exc: BaseException, debug: bool) -> int:
    """One line for a database lost where no retry loop covers it."""
    if debug:
        traceback.print_exc()
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    error(f"database: {first}")
    return 2


def error(message: str) -> None:
    """The one line of an error that ends the command. Its text is from outside as often as not
    (a DATABASE_URL, a key of a JSONL line, a server's message): escapes and line breaks in it
    print as text, never as terminal controls or a line of the program's own."""
    print(f"sidelinja-worker: error: {printable(message)}", file=sys.stderr)


def stdout_closed() -> bool:
    """Whether stdout is a pipe whose reader is gone (poll says POLLERR on its write end); if
    so, stdout becomes /dev/null, so that the interpreter's last flush at exit does not fail
    again with a message of its own."""
    try:
        fd = sys.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        closed = any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError):  # no file descriptor behind stdout
        return False
    if closed:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, fd)
        os.close(null)
    return closed
