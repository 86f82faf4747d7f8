"""`sidelinja-worker enqueue --file jobs.jsonl` (`-` for stdin): one job per line, a JSON object
with job_queue's column names, inserted in batches through the client's enqueue_many with a
progress bar.

All or nothing by default: every batch goes in one transaction, and the first bad line (its
number and what is wrong) rolls it all back, so a file is never half enqueued. `--skip-bad`
enqueues the good lines instead and lists every bad one on stderr. A line longer than
MAX_LINE_BYTES is bad without being parsed; blank lines are skipped."""

from __future__ import annotations

import argparse
import os
import stat
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import replace
from typing import IO, Any
from uuid import UUID

import asyncpg
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sidelinja_worker.cli import newjob, progress
from sidelinja_worker.cli.session import opened, parse_uuid
from sidelinja_worker.queue import client, store
from sidelinja_worker.queue.db import say
from sidelinja_worker.queue.errors import UserError
from sidelinja_worker.queue.escapes import printable
from sidelinja_worker.queue.ids import uuid7s

MAX_LINE_BYTES = 1 << 20  # a payload bigger than this belongs in a file the job reads
BATCH = 1000  # jobs per enqueue_many: COPY for plain jobs, one statement each batch
# Row-level security refuses COPY; enqueue_many inserts smaller batches with INSERT instead.
RLS_BATCH = client.COPY_MIN_JOBS - 1
BAD_LINES_SHOWN = 50  # with --skip-bad, the first this many are listed, then a count
DRAIN_CHUNK = 1 << 16
# Workspaces whose existence is remembered; a file may name a new one on every line.
WORKSPACES_KEPT = 10_000


class JobLine(BaseModel):
    """One line of the file; unknown keys are refused (a typo must not pass silently)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    job_type: str | None = None  # default: the command's JOB_TYPE
    workspace_id: str | None = None  # default: --workspace
    payload: dict[str, Any] = Field(default_factory=dict)
    priority: int | None = None
    scheduled_for: str | None = None  # ISO 8601, UTC if no zone
    max_attempts: int = newjob.DEFAULT_MAX_ATTEMPTS
    unique_key: str | None = Field(None, min_length=1, max_length=newjob.UNIQUE_KEY_MAX)
    timeout_s: int | None = Field(None, ge=1, le=newjob.INT32_MAX)


def add_flags(enqueue: argparse.ArgumentParser) -> None:
    enqueue.add_argument(
        "--file",
        metavar="PATH",
        help="enqueue one job per line of this JSON Lines file (- for stdin): job_type, payload, "
        "workspace_id, priority, scheduled_for, max_attempts, unique_key, timeout_s; JOB_TYPE "
        "and --workspace are the defaults. All lines or none",
    )
    enqueue.add_argument(
        "--skip-bad",
        action="store_true",
        help="with --file: enqueue the good lines and list the bad ones, instead of none",
    )


# Single-job flags that have a per-line key instead; given with --file they would be ignored.
_SINGLE_ONLY = ("payload", "priority", "delay", "at", "max_attempts", "unique_key", "timeout")


async def run(args: argparse.Namespace) -> int:
    given = [name for name in _SINGLE_ONLY if getattr(args, name) is not None]
    if given:
        flag = "--in" if given[0] == "delay" else "--" + given[0].replace("_", "-")
        raise UserError(f"{flag} does not go with --file: give it per line (see --help)")
    default_workspace = parse_uuid(args.workspace, "--workspace") if args.workspace else None
    if args.job_type is not None:
        newjob.new_job(UUID(int=0), args.job_type, {})  # an unknown JOB_TYPE fails here
    name = "stdin" if args.file == "-" else args.file
    with ExitStack() as stack:
        stream = sys.stdin.buffer if args.file == "-" else stack.enter_context(_open(args.file))
        size = _size(stream, name)
        # Typed at a terminal: a bar redrawn over the typing garbles it, and a user who meets
        # a cursor that waits needs to know how to end the file.
        typed = stream.isatty()
        shown = progress.wanted(args.settings.log_format) and not typed
        if typed:
            say("sidelinja-worker: type one JSON object per line; Ctrl-D ends the file")
        async with opened(args) as (_db, pool), pool.acquire() as conn:
            reader = Reader(args, conn, default_workspace, name)
            with progress.bar(
                f"enqueueing {os.path.basename(name)}",  # the bar keeps its width
                size,
                shown=shown,
                counted="{task.fields[jobs]} jobs",
                jobs=0,
            ) as bar:
                async with conn.transaction():
                    enqueued = await reader.enqueue_all(stream, bar)
    joined = progress.count(reader.joined, "line")
    held = f"; {joined} joined the job holding its unique key" if reader.joined else ""
    skipped = progress.count(reader.bad, "bad line")
    skipped = f"; skipped {skipped} (listed above)" if reader.bad else ""
    print(f"enqueued {progress.count(enqueued, 'job')} from {name}{held}{skipped}")
    newjob.warn_missing_settings(args, reader.job_types)
    return 1 if reader.bad else 0


def _open(path: str) -> IO[bytes]:
    try:
        return open(path, "rb")
    except OSError as exc:
        raise UserError(f"--file: cannot read {path}: {exc.strerror}") from None


def _size(stream: IO[bytes], name: str) -> int | None:
    """The bar's total in bytes: a regular file's size; a pipe's is unknown. A device other
    than a terminal or /dev/null is refused: /dev/zero and /dev/urandom never end, and were
    read for ever (with --skip-bad, every line of their noise bad)."""
    try:
        info = os.fstat(stream.fileno())
    except (OSError, ValueError):
        return None
    if stat.S_ISBLK(info.st_mode) or (
        stat.S_ISCHR(info.st_mode) and not stream.isatty() and not _is_devnull(info)
    ):
        raise UserError(f"--file: {name} is a device, not a file or a pipe")
    return info.st_size if stat.S_ISREG(info.st_mode) else None


def _is_devnull(info: os.stat_result) -> bool:
    try:
        return os.stat(os.devnull).st_rdev == info.st_rdev
    except OSError:
        return False


class Lines:
    """A stream's lines as (line number, the line or None when longer than MAX_LINE_BYTES);
    `read` counts the bytes consumed so far. Never holds more than MAX_LINE_BYTES of one line
    in memory, and skips the rest of a long line only when the next line is asked for: the
    command that stops at the first bad line does not read on to the end of it (a pipe whose
    writer goes on would have held it for ever)."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream
        self.read = 0

    def __iter__(self) -> Iterator[tuple[int, bytes | None]]:
        number = 0
        while raw := self._readline(MAX_LINE_BYTES + 1):
            number += 1
            if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                yield number, None
                while raw and not raw.endswith(b"\n"):  # drop the rest of the long line
                    raw = self._readline(DRAIN_CHUNK)
            else:
                yield number, raw

    def _readline(self, limit: int) -> bytes:
        raw = self._stream.readline(limit)
        self.read += len(raw)
        return raw


class Reader:
    """Turns lines into checked jobs and enqueues them in batches on one connection."""

    def __init__(
        self,
        args: argparse.Namespace,
        conn: asyncpg.Connection,
        default_workspace: UUID | None,
        name: str,
    ) -> None:
        self.args = args
        self.conn = conn
        self.default_workspace = default_workspace
        self.name = name
        self.bad = 0  # counted, not kept: a file can hold millions
        self.job_types: set[str] = set()
        self._workspaces: dict[UUID, bool] = {}
        self.enqueued = 0
        self.joined = 0

    async def enqueue_all(self, stream: IO[bytes], bar: progress.Bar) -> int:
        """Enqueues every good line; returns how many new jobs went in (self.joined counts the
        lines whose unique key a queued or running job holds: they are that job)."""
        under_rls = await self.conn.fetchval("SELECT row_security_active('job_queue')")
        batch_size = RLS_BATCH if under_rls else BATCH
        batch: list[client.NewJob] = []
        lines = Lines(stream)
        for number, raw in lines:
            job = await self._job(number, raw)
            if job is not None:
                batch.append(job)
            if len(batch) >= batch_size:
                await self._enqueue(batch)
                batch = []
                bar.update(completed=lines.read, jobs=self.enqueued)
        if batch:
            await self._enqueue(batch)
        bar.update(total=lines.read, completed=lines.read, jobs=self.enqueued)
        return self.enqueued

    async def _enqueue(self, batch: list[client.NewJob]) -> None:
        # Ids given in advance tell a new job from a line deduplicated onto a holder.
        jobs = [replace(j, job_id=i) for j, i in zip(batch, uuid7s(len(batch)), strict=True)]
        try:
            got = await client.enqueue_many(self.conn, jobs)
        except client.UniqueKeyUnresolved as exc:  # a race with the key's holders: try again
            raise UserError(f"{self.name}: {exc}; nothing was enqueued") from None
        joined = sum(j.job_id != i for j, i in zip(jobs, got, strict=True))
        self.joined += joined
        self.enqueued += len(jobs) - joined

    async def _job(self, number: int, raw: bytes | None) -> client.NewJob | None:
        """The line's job; None for a blank line or (with --skip-bad) a bad one."""
        if raw is not None and not raw.strip():
            return None
        try:
            return await self._parse(raw)
        except UserError as exc:
            where = f"{self.name} line {number}"
            if not self.args.skip_bad:
                raise UserError(f"{where}: {exc}; nothing was enqueued") from None
            self.bad += 1
            if self.bad <= BAD_LINES_SHOWN:
                # The reason names the line's keys, which are any text: printed as text.
                print(f"sidelinja-worker: skipped {where}: {printable(exc)}", file=sys.stderr)
            elif self.bad == BAD_LINES_SHOWN + 1:
                print("sidelinja-worker: (more bad lines: not listed)", file=sys.stderr)
            return None

    async def _parse(self, raw: bytes | None) -> client.NewJob:
        if raw is None:
            raise UserError(f"longer than {MAX_LINE_BYTES} bytes")
        try:
            line = JobLine.model_validate_json(raw)
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            field = ".".join(str(p) for p in first["loc"])
            raise UserError(f"{field}: {first['msg']}" if field else first["msg"]) from None
        job_type = line.job_type or self.args.job_type
        if job_type is None:
            raise UserError("no job_type (give it on the line, or JOB_TYPE for every line)")
        if line.workspace_id is not None:
            workspace = parse_uuid(line.workspace_id, "workspace_id")
        elif self.default_workspace is not None:
            workspace = self.default_workspace
        else:
            raise UserError("no workspace_id (give it on the line, or --workspace)")
        if not await self._workspace_exists(workspace):
            raise UserError(f"no workspace {workspace}")
        job = newjob.new_job(
            workspace,
            job_type,
            line.payload,
            priority=line.priority,
            scheduled_for=newjob.parse_timestamp(line.scheduled_for, "scheduled_for")
            if line.scheduled_for is not None
            else None,
            max_attempts=line.max_attempts,
            unique_key=line.unique_key,
            timeout_s=line.timeout_s,
        )
        self.job_types.add(job_type)
        return job

    async def _workspace_exists(self, workspace: UUID) -> bool:
        known = self._workspaces.get(workspace)
        if known is None:
            if len(self._workspaces) >= WORKSPACES_KEPT:
                self._workspaces.clear()
            known = self._workspaces[workspace] = await store.workspace_exists(self.conn, workspace)
        return known
