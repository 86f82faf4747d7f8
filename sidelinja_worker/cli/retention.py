"""`sidelinja-worker prune [--dry-run]`: deletes the finished jobs past retention now, by the
worker's own prune (same statement, same batches, graphs only whole), with a progress bar and a
final count. The retention is the worker's: SIDELINJA_KEEP_COMPLETED and SIDELINJA_KEEP_ERRORS,
or this command's --keep-completed and --keep-errors, validated as `run`'s are."""

from __future__ import annotations

import argparse

import asyncpg

from sidelinja_worker.cli import progress
from sidelinja_worker.cli.session import opened
from sidelinja_worker.queue import maintenance


def add_command(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "prune",
        help="delete finished jobs past retention now (as the worker's prune does), with progress",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="count what would go (the same deletes, in a transaction rolled back at the end)",
    )
    # dest = the settings' field: settings.load validates and bounds them as `run`'s flags.
    for flag, env, default, jobs in (
        ("--keep-completed", "SIDELINJA_KEEP_COMPLETED", "14d", "completed and cancelled jobs"),
        ("--keep-errors", "SIDELINJA_KEEP_ERRORS", "90d", "jobs that ended in error"),
    ):
        p.add_argument(
            flag,
            dest=flag[2:].replace("-", "_"),
            metavar="DURATION",
            default=argparse.SUPPRESS,
            help=f"retention of {jobs} [env {env}] ({default})",
        )


async def run(args: argparse.Namespace) -> int:
    keep_completed, keep_errors = args.settings.keep_completed, args.settings.keep_errors
    shown = progress.wanted(args.settings.log_format)
    async with opened(args) as (_db, pool):
        at_most = await maintenance.past_retention(pool, keep_completed, keep_errors)
        verb = "would delete" if args.dry_run else "deleting"
        with progress.bar(f"{verb} finished jobs", at_most, shown=shown) as bar:
            if args.dry_run:
                deleted = await _dry_run(pool, keep_completed, keep_errors, bar.advance)
            else:
                deleted = await maintenance.prune_past_retention(
                    pool, keep_completed, keep_errors, on_batch=bar.advance
                )
            bar.update(total=deleted, completed=deleted)
    kept = at_most - deleted
    held = (
        f"; {kept} past retention kept (with a graph not yet past it, or referenced from"
        " another table)"
        if kept > 0
        else ""
    )
    said = "would prune" if args.dry_run else "pruned"
    print(f"{said} {progress.count(deleted, 'job')}{held}")
    return 0


async def _dry_run(
    pool: asyncpg.Pool, keep_completed: float, keep_errors: float, on_batch: progress.Advance
) -> int:
    """The real prune in one transaction that is rolled back: the count is exact, by the very
    same rule. Its row locks last until the end, so a worker's prune of the same rows waits (or
    skips a round on its statement timeout) meanwhile."""
    async with pool.acquire() as conn:
        transaction = conn.transaction()
        await transaction.start()
        try:
            return await maintenance.prune_past_retention(
                conn, keep_completed, keep_errors, on_batch=on_batch
            )
        finally:
            await transaction.rollback()
