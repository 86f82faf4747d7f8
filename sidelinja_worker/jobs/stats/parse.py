"""One parse of a log's files from where the last run stopped: the entry point that runs in a
worker process, returning plain, picklable totals."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zstandard

from sidelinja_worker.jobs.stats.counting import (
    MAX_EPISODES,
    EpisodeRules,
    Listen,
    ListenerKey,
    Tally,
)
from sidelinja_worker.jobs.stats.logfiles import LogFile, read_blocks, utf8_text
from sidelinja_worker.jobs.stats.spill import CHUNK_RECORDS, Record, merge_runs, read_chunks


@dataclass(frozen=True, slots=True)
class FileTask:
    """A file to read and where to start: the offset recorded for its fingerprint, if any."""

    path: Path
    rotated: bool
    fingerprint: str
    start: int
    folder: Path | None = None  # the folder it must be opened in (LogFile.folder)


@dataclass(frozen=True, slots=True)
class FileDone:
    fingerprint: str
    name: str
    offset: int
    complete: bool  # a rotated file read to its end: never opened again


@dataclass
class ParseResult:
    listens: dict[ListenerKey, Listen] = field(default_factory=dict)
    families: dict[str, str] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)
    paths: dict[str, str] = field(default_factory=dict)
    files: list[FileDone] = field(default_factory=list)
    lines: int = 0
    bad_lines: int = 0
    counted_requests: int = 0
    errors: list[str] = field(default_factory=list)
    # A parse that spilled leaves `listens` empty and its merged listeners in this file.
    spill: str | None = None
    days: list[int] = field(default_factory=list)  # the UTC days with listeners, sorted
    episodes: list[str] = field(default_factory=list)  # the episodes with listeners, sorted
    listeners: int = 0

    def listen_batches(self) -> Iterator[list[Record]]:
        """Every listener as a spill record, a chunk at a time, from memory or the file."""
        if self.spill is not None:
            yield from read_chunks(Path(self.spill))
            return
        families = self.families
        batch: list[Record] = []
        for (day, episode, ip, agent), listen in self.listens.items():
            batch.append(
                (day, episode, ip, agent, families.get(agent, ""), listen.bytes, listen.whole)
            )
            if len(batch) >= CHUNK_RECORDS:
                yield batch
                batch = []
        if batch:
            yield batch

    def __reduce__(self) -> tuple[Callable[..., ParseResult], tuple[Any, ...]]:
        # The child hands this to the worker pickled. As columns of plain values it pickles in
        # C, ~3x faster and with a much smaller memo than a tuple and a Listen per listener, and
        # each shared string (episode, agent, address) goes once.
        keys = self.listens.keys()
        days, episodes, ips, agents = ([key[i] for key in keys] for i in range(4))
        sent = [listen.bytes for listen in self.listens.values()]
        whole = [listen.whole for listen in self.listens.values()]
        return _unpickle, (
            (days, episodes, ips, agents, sent, whole),
            self.families,
            self.sizes,
            self.paths,
            self.files,
            self.lines,
            self.bad_lines,
            self.counted_requests,
            self.errors,
            self.spill,
            self.days,
            self.episodes,
            self.listeners,
        )


def _unpickle(columns: tuple[list[Any], ...], *rest: Any) -> ParseResult:
    days, episodes, ips, agents, sent, whole = columns
    listens = dict(
        zip(zip(days, episodes, ips, agents, strict=True), map(Listen, sent, whole), strict=True)
    )
    return ParseResult(listens, *rest)


def parse_files(
    tasks: list[FileTask],
    rules: EpisodeRules,
    spill_dir: Path | None = None,
    spill_at: int | None = None,
    last_day: int | None = None,
) -> ParseResult:
    """Reads every task's new lines into one tally. Pure apart from reading the files (and,
    past `spill_at` listeners in memory, writing sorted runs into `spill_dir`, merged at the
    end into `spill_dir/listeners`). `last_day`: the last day a download can have (days since
    the epoch; None: tomorrow by this machine's clock)."""
    tally = Tally(rules, spill_at=spill_at, spill_dir=spill_dir)
    if last_day is not None:
        tally.last_day = last_day
    done: list[FileDone] = []
    errors: list[str] = []
    # The tally only grows (no reference cycles), and the collector's repeated scans of its
    # many small objects cost more than the parse itself on big logs.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for task in tasks:
            done.append(_parse_one(task, tally, errors))
    finally:
        if was_enabled:
            gc.enable()
    if tally.refused_episodes:
        errors.append(
            f"more than {MAX_EPISODES:,} episodes in one run: requests for "
            f"{tally.refused_episodes:,} other paths were not counted"
        )
    if tally.runs:
        return _spilled(tally, done, errors)
    listens = tally.listens
    return ParseResult(
        listens,
        tally.families,
        tally.sizes,
        tally.paths,
        done,
        tally.lines,
        tally.bad_lines,
        tally.counted_requests,
        errors,
        None,
        sorted({key[0] for key in listens}),
        sorted({key[1] for key in listens}),
        len(listens),
    )


def _spilled(tally: Tally, done: list[FileDone], errors: list[str]) -> ParseResult:
    """The runs merged into one file of every listener, in key order, the runs removed."""
    tally.spill()
    assert tally.spill_dir is not None
    merged = tally.spill_dir / "listeners"
    count = merge_runs(tally.runs, merged)
    for run in tally.runs:
        run.unlink()
    return ParseResult(
        {},
        {},
        tally.sizes,
        tally.paths,
        done,
        tally.lines,
        tally.bad_lines,
        tally.counted_requests,
        errors,
        str(merged),
        sorted(tally.spilled_days),
        sorted(tally.spilled_episodes),
        count,
    )


def _parse_one(task: FileTask, tally: Tally, errors: list[str]) -> FileDone:
    """A corrupt or truncated compressed file is read up to the damage and reported; a rotated
    one is then marked done (it will not heal), a live one is tried again next run."""
    log = LogFile(task.path, task.rotated, task.folder)
    offset = task.start
    try:
        for block, offset in read_blocks(log, task.start):  # noqa: B007 - the last is kept
            tally.add_block(block)
    except (OSError, EOFError, zstandard.ZstdError) as exc:
        errors.append(utf8_text(f"{task.path.name}: {type(exc).__name__}: {exc}"))
    return FileDone(task.fingerprint, utf8_text(task.path.name), offset, task.rotated)
