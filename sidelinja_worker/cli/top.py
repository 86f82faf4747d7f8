"""`sidelinja-worker top`: a live terminal view of the queue (depth, throughput, failures per job
type, paused types) and the workers, redrawn in place every --interval seconds until Ctrl-C."""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime

import asyncpg
from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.live import Live
from rich.table import Table
from rich.text import Text

from sidelinja_worker.cli.session import opened
from sidelinja_worker.cli.terminal import plain
from sidelinja_worker.jobs.catalog import REGISTRY
from sidelinja_worker.queue import store
from sidelinja_worker.queue.backoff import clamp_s
from sidelinja_worker.queue.store import OTHER_TYPES

WINDOW_MIN = 5  # throughput over this many minutes (per-minute aggregates)
TOP_MAX_TYPES = 100  # job types named in the jobs table; the top_depth query keeps as many
TYPE_MAX_CHARS = 512  # a job type is named by this many of its characters, as in top_depth
REDRAW_MIN_S = 0.2
REDRAW_MAX_S = 3600.0


def redraw_interval_s(given: float) -> float:
    """--interval within [REDRAW_MIN_S, REDRAW_MAX_S]; NaN (argparse's float takes "nan")
    means the default, 2 s."""
    return max(clamp_s(given, REDRAW_MAX_S, 2.0) or 0.0, REDRAW_MIN_S)


def add_command(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("top", help="a live view of queue depth, throughput, failures and workers")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between redraws (2)")
    p.add_argument("--once", action="store_true", help="print one view and exit")


async def run(args: argparse.Namespace) -> int:
    async with opened(args) as (_db, pool):
        console = Console()
        if args.once:
            console.print(await view(pool))
            return 0
        with Live(await view(pool), console=console, screen=True, auto_refresh=False) as live:
            try:
                while True:
                    await asyncio.sleep(redraw_interval_s(args.interval))
                    live.update(await view(pool), refresh=True)
            except (KeyboardInterrupt, asyncio.CancelledError):
                pass
    return 0


def types_shown(job_types: list[str] | None) -> str:
    """A worker's job types: "all" for every one this version knows (a worker started without
    --types registers the whole list, which a column cuts to its first one or two)."""
    if not job_types or set(job_types) >= set(REGISTRY):
        return "all"
    return ",".join(job_types)


@dataclass
class TypeRow:
    """One row of the jobs table: a job type's counts, or those of the types past the cap."""

    waiting: int = 0
    due: int = 0
    running: int = 0
    completed: int = 0
    failed: int = 0
    paused: bool = False

    def add(self, other: TypeRow) -> None:
        self.waiting += other.waiting
        self.due += other.due
        self.running += other.running
        self.completed += other.completed
        self.failed += other.failed

    @property
    def busy(self) -> int:
        return self.waiting + self.running + self.completed + self.failed


def type_rows(
    depth: list[asyncpg.Record], done: list[asyncpg.Record], paused: list[asyncpg.Record]
) -> list[tuple[str | None, TypeRow]]:
    """The jobs table's rows: at most TOP_MAX_TYPES job types by name, the busiest (paused ones
    first among equals), sorted by name, then the rest as one row under None. Any plain-SQL
    writer enqueues, pauses or completes jobs of as many types, as long, as it likes: every one
    on every redraw made a view of 50,000 types take 97 s, and a type of 1.2 MB fill 50,000
    lines. The depth query caps itself the same way; throughput and pauses add their types."""
    rows: dict[str | None, TypeRow] = {}
    for r in depth:
        row = rows.setdefault(_named(r["job_type"]), TypeRow())
        row.waiting += r["waiting"]
        row.due += r["due"]
        row.running += r["running"]
    for r in done:
        row = rows.setdefault(_named(r["job_type"]), TypeRow())
        row.completed += r["completed"]
        row.failed += r["failed"]
    for r in paused:
        rows.setdefault(_named(r["job_type"]), TypeRow()).paused = True
    ranked = sorted(
        (t for t in rows if t is not None), key=lambda t: (-rows[t].busy, not rows[t].paused, t)
    )
    other = rows.pop(None, None)
    for job_type in ranked[TOP_MAX_TYPES:]:
        other = other or TypeRow()
        other.add(rows.pop(job_type))
    shown: list[tuple[str | None, TypeRow]] = sorted(
        ((t, r) for t, r in rows.items() if t is not None), key=lambda item: str(item[0])
    )
    return shown + ([(None, other)] if other is not None else [])


def _named(job_type: str | None) -> str | None:
    return None if job_type is None else job_type[:TYPE_MAX_CHARS]


async def view(pool: asyncpg.Pool) -> Group:
    depth = await store.top_depth(pool)
    done = await store.top_throughput(pool, WINDOW_MIN)
    paused = await store.list_pauses(pool)
    oldest = await store.oldest_due_s(pool)
    workers = await store.list_workers(pool)

    jobs = Table(title=f"Jobs (throughput over the last {WINDOW_MIN} min)", expand=True)
    # A job type is one line, cut with an ellipsis to the width the numbers leave (ratio: the
    # other columns keep their own): wrapped, one of 512 characters from a plain-SQL writer
    # filled the screen and hid every other row.
    jobs.add_column("type", no_wrap=True, overflow="ellipsis", ratio=1)
    for name in ("waiting", "due", "running", "done/min", "failed/min"):
        jobs.add_column(name, justify="right")
    jobs.add_column("")
    for job_type, row in type_rows(depth, done, paused):
        jobs.add_row(
            plain(job_type) if job_type is not None else Text(OTHER_TYPES, style="italic"),
            str(row.waiting),
            str(row.due),
            str(row.running),
            f"{row.completed / WINDOW_MIN:.1f}",
            f"{row.failed / WINDOW_MIN:.1f}",
            Text("PAUSED", style="bold yellow") if row.paused and job_type is not None else "",
        )
    fleet = Table(title="Workers", expand=True)
    for name in ("state", "host", "pid", "version", "types", "at once", "running", "heartbeat"):
        fleet.add_column(name)
    for w in workers:
        state = "dead" if not w["alive"] else "draining" if w["drain_requested_at"] else "live"
        fleet.add_row(
            Text(state, style={"live": "green", "draining": "yellow"}.get(state, "red")),
            plain(w["hostname"]),
            str(w["pid"]),
            plain(w["version"] or ""),
            plain(types_shown(w["job_types"])),
            str(w["concurrency"] or ""),
            str(w["running_count"]),
            f"{w['last_heartbeat_at']:%H:%M:%S}" if w["last_heartbeat_at"] else "",
        )
    waiting = sum(r["waiting"] for r in depth)
    header = Header(
        "sidelinja-worker top",
        f"{datetime.now(UTC):%H:%M:%S} UTC",
        f"queue depth {waiting}",
        "nothing due" if oldest is None else f"oldest due {oldest:.1f} s",
        f"{sum(w['alive'] for w in workers)} live workers",
        "Ctrl-C to quit",
    )
    return Group(header, jobs, fleet)


class Header:
    """The line above the tables, broken between its parts where the terminal is too narrow
    for all of them: rich breaks a line between any two words ("1" at one line's end, "live
    workers" at the next one's start). Laid out at each redraw, for the width of that moment."""

    SEPARATOR = " · "

    def __init__(self, *parts: str) -> None:
        self.parts = parts

    def lines(self, width: int) -> list[str]:
        lines = [self.parts[0]]
        for part in self.parts[1:]:
            joined = lines[-1] + self.SEPARATOR + part
            if len(joined) <= width:
                lines[-1] = joined
            else:
                lines.append(part)
        return lines

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield Text("\n".join(self.lines(options.max_width)), style="bold")
