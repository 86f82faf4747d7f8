"""Progress for long CLI work (bulk enqueue, retention, migrations): a rich bar on stderr when
stderr is a terminal and the logs are text; otherwise nothing until the command's plain final
line, so piped output, CI logs and JSON log streams never carry control characters."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)

from sidelinja_worker.queue import logs

Advance = Callable[[int], None]  # a bar's advance, handed to work that counts in steps


def count(n: int, noun: str) -> str:
    """ "1 job", "2 jobs": the final line reads as a sentence."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def wanted(log_format: str | None) -> bool:
    """A live display only on a terminal, and never in the middle of JSON log lines."""
    return sys.stderr.isatty() and not logs.want_json(sys.stderr, forced=log_format)


class Bar:
    """One task of a progress display; every method is a no-op when nothing is shown."""

    def __init__(self, progress: Progress | None, task: TaskID | None) -> None:
        self._progress = progress
        self._task = task

    def advance(self, amount: float = 1, **fields: Any) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, advance=amount, **fields)

    def update(self, **changes: Any) -> None:
        """`total=`, `completed=`, `description=` or a field shown by the columns."""
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, **changes)


@contextmanager
def bar(
    description: str, total: float | None, *, shown: bool, counted: str = "", **fields: Any
) -> Iterator[Bar]:
    """A bar with `total` steps (None: a spinner until the end is known). `counted` is a column
    template over the task's fields, e.g. "{task.fields[lines]} lines"."""
    if not shown:
        yield Bar(None, None)
        return
    columns = [
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TextColumn(counted) if counted else MofNCompleteColumn(),
        TimeElapsedColumn(),
    ]
    with Progress(*columns, console=Console(stderr=True), transient=False) as progress:
        yield Bar(progress, progress.add_task(description, total=total, **fields))


@contextmanager
def steps(shown: bool) -> Iterator[Steps]:
    """A list of named steps, each with a spinner and its elapsed time while it runs (the
    migrations: which one runs, n of m, and for how long)."""
    if not shown:
        yield Steps(None)
        return
    columns = [SpinnerColumn(finished_text="✓"), TextColumn("{task.description}")]
    with Progress(*columns, TimeElapsedColumn(), console=Console(stderr=True)) as progress:
        yield Steps(progress)


class Steps:
    def __init__(self, progress: Progress | None) -> None:
        self._progress = progress
        self._current: TaskID | None = None

    def start(self, description: str) -> None:
        """Ends the running step, if any, and starts the next."""
        if self._progress is None:
            return
        self.finish()
        self._current = self._progress.add_task(description, total=1)

    def finish(self) -> None:
        if self._progress is not None and self._current is not None:
            self._progress.update(self._current, completed=1)
            self._progress.stop_task(self._current)
            self._current = None
