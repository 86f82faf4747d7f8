"""`sidelinja-worker limits`: show and change the cluster-wide limits stored in the database.
Workers re-read them on change (NOTIFY), so no restart is needed."""

from __future__ import annotations

import argparse
from uuid import UUID

import asyncpg

from sidelinja_worker.cli import newjob
from sidelinja_worker.cli.session import parse_uuid
from sidelinja_worker.jobs.catalog import REGISTRY
from sidelinja_worker.queue import store
from sidelinja_worker.queue.durations import parse_duration_s
from sidelinja_worker.queue.errors import UserError
from sidelinja_worker.queue.escapes import printable
from sidelinja_worker.services import ai_gateway
from sidelinja_worker.settings import FALSE, TRUE

# The keys a handler of this installation passes to ctx.services.limiter.acquire: a row under
# any other key spaces no call.
RATE_KEYS = frozenset({ai_gateway.RATE_KEY})

USAGE = """examples:
  sidelinja-worker limits                                  show every limit
  sidelinja-worker limits type whisper_transcribe 1        at most 1 at once, cluster-wide
  sidelinja-worker limits workspace WORKSPACE_ID 5         at most 5 running jobs of a workspace
  sidelinja-worker limits rate ai_gateway 20/1m            at most 20 calls in any minute
  sidelinja-worker limits fair off                         oldest first, ignoring workspaces
  (use `none` as the value to remove a limit)"""
# Bounds on what an operator types: more is a typo, and the table's integer columns hold at
# most 2,147,483,647 (a bigger number failed with a traceback). A window longer than a year
# is one no service means; the workers read longer ones written by SQL as a year.
MAX_COUNT = 1_000_000
MAX_WINDOW_S = 366 * 86400.0


def add_command(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "limits",
        help="show or change cluster-wide limits",
        epilog=USAGE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("kind", nargs="?", choices=["type", "workspace", "rate", "fair"])
    p.add_argument(
        "name",
        nargs="?",
        help=f"job type, workspace id, rate key ({', '.join(sorted(RATE_KEYS))}, or one already "
        "set), or on/off",
    )
    p.add_argument("value", nargs="?", help="N, N/DURATION for a rate, or none")


async def run(args: argparse.Namespace, pool: asyncpg.Pool) -> int:
    if args.kind is None:
        return await show(pool)
    if args.name is None or (args.kind != "fair" and args.value is None):
        raise UserError("usage: limits type|workspace|rate NAME VALUE, or limits fair on|off")
    if args.kind == "fair":
        word = args.name.lower()
        if word not in TRUE | FALSE:
            raise UserError("limits fair takes on or off (or yes/no, true/false, 1/0)")
        await store.set_queue_setting(pool, "fair_workspaces", word in TRUE)
    elif args.kind == "type":
        cap = _count(args.value)
        # A cap on a name no worker runs caps nothing (a typo); removing one is always allowed.
        if cap is not None and args.name not in REGISTRY:
            raise newjob.unknown_type(args.name)
        await store.set_type_limit(pool, args.name, cap)
    elif args.kind == "workspace":
        await _set_workspace_limit(pool, parse_uuid(args.name, "workspace"), _count(args.value))
    else:
        rate = _rate(args.value)
        # As for a type's cap: a typo is refused, a row already there stays editable, and
        # removing one is always allowed.
        if rate is not None and args.name not in RATE_KEYS:
            stored = {r["name"] for r in await store.list_limits(pool) if r["kind"] == "rate"}
            if args.name not in stored:
                known = ", ".join(printable(k) for k in sorted(RATE_KEYS | stored))
                raise UserError(f"unknown rate key {args.name!r}; known: {known}")
        await store.set_rate_limit(pool, args.name, *(rate or (None, None)))
    return await show(pool)


async def _set_workspace_limit(pool: asyncpg.Pool, workspace: UUID, cap: int | None) -> None:
    try:
        await store.set_workspace_limit(pool, workspace, cap)
    except asyncpg.ForeignKeyViolationError:  # a cap belongs to a workspace that exists
        raise UserError(f"no workspace {workspace}") from None


async def show(pool: asyncpg.Pool) -> int:
    rows = await store.list_limits(pool)
    print(f"{'KIND':<10} {'NAME':<38} {'LIMIT':<18} {'RUNNING':>7}  PAUSED UNTIL")
    for r in rows:
        running = "" if r["running"] is None else str(r["running"])
        paused = "" if r["paused_until"] is None else f"{r['paused_until']:%Y-%m-%d %H:%M:%S %Z}"
        name = printable(r["name"])  # a job type or rate key that SQL may have written
        print(f"{r['kind']:<10} {name:<38} {r['limit_text']:<18} {running:>7}  {paused}")
    return 0


def _count(text: str) -> int | None:
    if text.lower() == "none":
        return None
    if not _digits(text):
        raise UserError(f"limit {_short(text)} must be a whole number or none")
    if _over_max(text):
        raise UserError(f"limit {_short(text)}: at most {MAX_COUNT:,} (or none: no limit)")
    return int(text)


def _digits(text: str) -> bool:
    """0-9 only: str.isdigit also says yes to '²', which int() refuses."""
    return text.isascii() and text.isdigit()


def _over_max(digits: str) -> bool:
    """Past MAX_COUNT, told without int() on thousands of digits (which raises ValueError)."""
    significant = digits.lstrip("0")
    return len(significant) > len(str(MAX_COUNT)) or int(significant or "0") > MAX_COUNT


def _short(text: str) -> str:
    """`text` quoted for an error line; thousands of digits are not repeated back."""
    return repr(text) if len(text) <= 40 else repr(text[:40] + "…")


def _rate(text: str) -> tuple[int, float] | None:
    if text.lower() == "none":
        return None
    count, _, window = text.partition("/")
    if not _digits(count) or not window or not count.strip("0"):
        raise UserError(f"rate {_short(text)} must look like 20/1m (calls per duration) or none")
    if _over_max(count):
        raise UserError(f"rate {_short(text)}: at most {MAX_COUNT:,} calls per window")
    per_s = parse_duration_s(window)
    if per_s <= 0:
        raise UserError(f"rate {_short(text)}: the duration must be positive")
    if per_s > MAX_WINDOW_S:
        raise UserError(f"rate {_short(text)}: the window is at most 366d")
    return int(count), per_s
