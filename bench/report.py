"""The result table: rows in, one markdown document out."""

from __future__ import annotations

import os
import platform
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from common import BENCH_DIR

import sidelinja_worker


@dataclass(frozen=True)
class Row:
    measure: str
    result: str
    target: str = ""
    met: bool | None = None  # None: no target


def verdict(met: bool | None) -> str:
    return "" if met is None else ("yes" if met else "**no**")


def table(rows: list[Row]) -> str:
    lines = ["| Measurement | Result | Target | Met |", "| --- | --- | --- | --- |"]
    lines += [f"| {r.measure} | {r.result} | {r.target} | {verdict(r.met)} |" for r in rows]
    return "\n".join(lines)


def worker_revision() -> str:
    """The commit of the worker under test, `+dirty` when its tree has uncommitted changes;
    or where it was imported from, when that is not this repository (PYTHONPATH)."""
    package = Path(sidelinja_worker.__file__).resolve().parent
    repo = BENCH_DIR.parent
    if package != repo / "sidelinja_worker":
        return f"imported from {package}"

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(repo), *args], capture_output=True, text=True, check=False
        ).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--", "sidelinja_worker")
    return head + ("+dirty" if dirty else "")


def environment(pg_version: str) -> list[str]:
    return [
        f"date {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        f"machine {platform.machine()}, nproc {len(os.sched_getaffinity(0))}",
        f"PostgreSQL {pg_version}",
        f"Python {platform.python_version()}",
        f"sidelinja-worker {worker_revision()}",
    ]


def document(title: str, rows: list[Row], pg_version: str, notes: list[str]) -> str:
    env = "; ".join(environment(pg_version))
    body = "\n".join(f"{i}. {note}" for i, note in enumerate(notes, 1))
    return f"# {title}\n\n{env}\n\n{table(rows)}\n\nNotes:\n\n{body}\n"
