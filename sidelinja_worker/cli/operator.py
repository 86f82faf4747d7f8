"""`sidelinja-worker pause|resume` (and `top`, in cli/top.py): stop and restart the claiming of a job type on every worker.
The pause is a row in job_type_pauses (plain SQL works as well); each is audited with who and
why."""

from __future__ import annotations

import argparse
import getpass
import socket

import asyncpg

from sidelinja_worker.admin import pauses
from sidelinja_worker.cli import newjob, progress, top
from sidelinja_worker.cli.session import opened
from sidelinja_worker.queue import store
from sidelinja_worker.queue.errors import UserError
from sidelinja_worker.queue.escapes import printable


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    top.add_command(sub)
    p = sub.add_parser(
        "pause",
        help="pause a job type on every worker (its jobs stay pending); no TYPE: list pauses",
    )
    p.add_argument("job_type", nargs="?", metavar="TYPE")
    p.add_argument("--reason", help="why (required to pause; kept in the audit log)")
    p.add_argument("--by", default=operator_name(), help="who (default: %(default)s)")
    p = sub.add_parser("resume", help="let workers take a paused job type again")
    p.add_argument("job_type", metavar="TYPE")
    p.add_argument("--reason", default="", help="why (kept in the audit log)")
    p.add_argument("--by", default=operator_name(), help="who (default: %(default)s)")


def operator_name() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry for the uid (a container)
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


async def dispatch(args: argparse.Namespace) -> int | None:
    if args.command == "top":
        return await top.run(args)
    if args.command not in ("pause", "resume"):
        return None
    async with opened(args) as (_db, pool):
        if args.command == "pause" and args.job_type is None:
            return await show(pool)
        if args.command == "pause":
            # The admin view's rule: a registered type or one jobs have; a resume takes any
            # name, as plain SQL may pause any.
            if not await pauses.pausable(pool, args.job_type, store.STATEMENT_TIMEOUT_S):
                raise newjob.unknown_type(args.job_type)
            if not args.reason:
                raise UserError("say why with --reason (it goes to the audit log)")
            if not await store.pause_type(pool, args.job_type, args.by, args.reason):
                print(f"{args.job_type} was already paused")
            else:
                print(f"paused {args.job_type}: workers take none of its jobs until resumed")
        elif await store.resume_type(pool, args.job_type, args.by, args.reason):
            print(f"resumed {args.job_type}")
        else:
            print(f"{args.job_type} was not paused")
        return 0


async def show(pool: asyncpg.Pool) -> int:
    rows = [dict(r) for r in await store.list_pauses(pool)]
    await pauses.name_authors(pool, rows, store.STATEMENT_TIMEOUT_S)
    if not rows:
        print("no job type is paused")
    for r in rows:
        # Plain SQL may pause a type with any text in its row.
        by, reason = printable(r["by"]), printable(r["reason"] or "no reason")
        print(
            f"{printable(r['job_type'])}: paused {r['paused_at']:%Y-%m-%d %H:%M:%S %Z} by {by}"
            f" ({reason}); {progress.count(r['waiting'], 'job')} waiting"
        )
    return 0
