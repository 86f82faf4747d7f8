"""`stats_parse`: Caddy access logs -> daily podcast downloads (IAB rules), then the next run.

Workspace settings, under `settings["stats"]` (all optional): `interval` ("1h"), `url_prefix`
("/"), `media_dir` ("", in the workspace media folder MEDIA_ROOT/<workspace id>), `episodes`
({path: id}), `hosts` ([]); `interval` is at least 60 s and at most 31 days.

Bounds on hostile logs: a line longer than logfiles.MAX_LINE_BYTES (1 MiB) is dropped, one
whose time is none or no download's (before 1970, after tomorrow), whose size is past
counting.MAX_RESPONSE_BYTES (64 GiB) or whose client_ip is no address (or longer than
counting.MAX_IP_CHARS, 64) is a bad line, a header's number past 18 digits is none; a
User-Agent is cut to counting.MAX_AGENT_CHARS (1 KiB), a path past counting.MAX_PATH_CHARS
(1 KiB) is no episode; past counting.MAX_EPISODES (20,000) episodes, other paths are not
counted; a compressed file expanding more than logfiles.MAX_EXPANSION_RATIO (200) times its size (beyond
16 MiB) fails the job permanently, naming the file; a zstd frame that needs a window over
logfiles.MAX_ZSTD_WINDOW (8 MiB) is a damaged file; past SPILL_LISTENERS listeners the parse
(or counting.SPILL_AGENT_BYTES, 16 MiB, of their agents) spills to sorted files in the
system's temporary folder (memory stays ~100 MB whatever the log holds, ~200 MB with every
cache full of the longest values it keeps; the totals are the same)."""

from __future__ import annotations

import asyncio
import hashlib
import math
import os
import pickle
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import replace
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import zstandard
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sidelinja_worker.jobs.media_paths import workspace_media_root
from sidelinja_worker.jobs.silos import UnsafeFile
from sidelinja_worker.jobs.stats import store as stats_store
from sidelinja_worker.jobs.stats.counting import AUDIO_EXTENSIONS, DAY_S, EpisodeRules
from sidelinja_worker.jobs.stats.geo import country_lookup
from sidelinja_worker.jobs.stats.logfiles import (
    LogFile,
    NoLogText,
    discover,
    fingerprint,
    utf8_text,
)
from sidelinja_worker.jobs.stats.media import threshold_bytes
from sidelinja_worker.jobs.stats.parse import FileTask, ParseResult
from sidelinja_worker.jobs.stats.spill import MAX_LISTENER_BYTES, Record
from sidelinja_worker.jobs.stats.store import FileSave, ListenRow
from sidelinja_worker.queue import clock
from sidelinja_worker.queue.client import NewJob
from sidelinja_worker.queue.context import JobContext
from sidelinja_worker.queue.durations import parse_duration_s
from sidelinja_worker.queue.errors import PermanentError, RetryJob, UserError
from sidelinja_worker.queue.priorities import default_priority
from sidelinja_worker.queue.registry import JobType, describe_validation_error

# A concurrent run that committed first makes this one re-read from its offsets; a few rounds.
COMMIT_ROUNDS = 3
# Listeners a parse holds in memory before it spills them to a sorted file (~400 bytes each
# with their strings): bounds the parse's memory whatever the log holds.
SPILL_LISTENERS = 100_000
# Listener rows per INSERT, read, hashed and sent a batch at a time.
ROW_BATCH = 20_000
MIN_INTERVAL_S = 60.0
MAX_INTERVAL_S = 31 * 86400.0
_GLOB = set("*?[")


class StatsParsePayload(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    logs: str = Field(
        min_length=1, description="log folder, live log file or glob, in the workspace media folder"
    )
    schedule: bool = Field(default=True, description="enqueue the next run after this one")


class StatsSettings(BaseModel):
    model_config = ConfigDict(frozen=True)

    interval: str | float = "1h"
    url_prefix: str = "/"
    media_dir: str = ""
    episodes: dict[str, str] | None = None
    hosts: list[str] = Field(default_factory=list)

    def rules(self) -> EpisodeRules:
        return EpisodeRules(self.url_prefix, AUDIO_EXTENSIONS, self.episodes, tuple(self.hosts))

    def interval_s(self) -> float:
        """Seconds between runs: at least MIN_INTERVAL_S; a value past MAX_INTERVAL_S (or not
        finite: "inf", "nan") fails the job naming the setting."""
        try:
            seconds = parse_duration_s(str(self.interval))
        except UserError as exc:
            raise PermanentError(f"settings stats.interval: {exc}") from None
        if not math.isfinite(seconds) or seconds > MAX_INTERVAL_S:
            raise PermanentError(
                f"settings stats.interval: {self.interval!r} is longer than "
                f"{MAX_INTERVAL_S / 86400:g} days"
            )
        return max(seconds, MIN_INTERVAL_S)


async def run(ctx: JobContext, payload: StatsParsePayload) -> dict[str, Any]:
    media_root = workspace_media_root(ctx.services.config.require("MEDIA_ROOT"), ctx.workspace_id)
    settings = _settings(await ctx.workspace_settings())
    # In a thread: a folder or '**' glob is a blocking file-system call per entry, seconds of
    # them over a big folder, which must not stall the other jobs on the event loop.
    logs = await asyncio.to_thread(resolve_logs, media_root, payload.logs)
    summary = await _parse_and_commit(ctx, logs, settings, media_root)
    if payload.schedule:
        summary["next_run"] = _schedule_next(ctx, payload, settings.interval_s()).isoformat()
    return summary


def _settings(workspace: dict[str, Any]) -> StatsSettings:
    try:
        return StatsSettings.model_validate(workspace.get("stats") or {})
    except ValidationError as exc:
        raise PermanentError(
            f"workspace settings stats: {describe_validation_error(exc)}"
        ) from None


def resolve_logs(media_root: Path, logs: str) -> list[LogFile]:
    """The payload's log files, under `media_root` (the workspace's media folder); a path
    outside it or naming nothing is permanent."""
    parts = Path(logs).parts
    cut = next((i for i, p in enumerate(parts) if _GLOB & set(p)), len(parts))
    try:
        base = (media_root / Path(*parts[:cut])).resolve() if cut else media_root
    except RuntimeError as exc:  # a symlink loop (Python 3.11; 3.13 resolves it as it is)
        raise PermanentError(f"logs {logs!r} cannot be resolved: {exc}") from None
    if not base.is_relative_to(media_root):
        raise PermanentError(f"logs {logs!r} is outside this workspace's media folder")
    if not base.exists():
        raise PermanentError(f"logs {logs!r} not found in this workspace's media folder")
    pattern = str(Path(*parts[cut:])) if cut < len(parts) else None
    _check_glob(logs, parts[cut:])
    files = [
        replace(f, folder=media_root)
        for f in discover(base, pattern)
        if f.path.resolve().is_relative_to(media_root)
    ]
    if not files:
        raise PermanentError(f"logs {logs!r}: no log files found")
    return files


def _check_glob(logs: str, parts: tuple[str, ...]) -> None:
    """A glob stays in the folder it starts from and walks it once: '..' would walk out of the
    workspace's media folder (to the whole file system), and each further '**' walks again
    every folder under each one the previous matched (five in 30 nested folders: seconds, in a
    thread the job's timeout cannot stop; eight: hours). Refusals are permanent: the payload
    will not change."""
    if ".." in parts:
        raise PermanentError(f"logs {logs!r}: a glob may not go up with '..'")
    stars = [p for p in parts if "**" in p]
    if len(stars) > 1 or any(p != "**" for p in stars):
        raise PermanentError(
            f"logs {logs!r}: a glob takes '**' at most once, as a whole path segment"
        )


async def _parse_and_commit(
    ctx: JobContext, logs: list[LogFile], settings: StatsSettings, media_root: Path
) -> dict[str, Any]:
    pool, ws = ctx.services.pool, ctx.workspace_id
    for _ in range(COMMIT_ROUNDS):
        prints, refused = await asyncio.to_thread(_fingerprints, logs)
        states = await stats_store.file_states(pool, ws, list(prints.values()))
        tasks, saves = plan(logs, prints, states)
        await ctx.progress(f"reading {len(tasks)} of {len(prints)} log files", None)
        with tempfile.TemporaryDirectory(prefix="sidelinja-stats-") as spill_dir:
            result = await parse_in_child(tasks, settings.rules(), Path(spill_dir))
            thresholds = await asyncio.to_thread(_thresholds, result, media_root, settings)
            days = [date.fromordinal(_EPOCH + d) for d in result.days]
            salts = await stats_store.salts(pool, ws, days)
            country = country_lookup(ctx.services.config.get("GEOIP_DB"))
            async with pool.acquire() as conn:
                added = await stats_store.commit_run(
                    conn,
                    ws,
                    {t.fingerprint: t.start for t in tasks},
                    saves
                    + [FileSave(f.fingerprint, f.name, f.offset, f.complete) for f in result.files],
                    _row_batches(result, salts, country),
                    days,
                    thresholds,
                    clock.now().date(),
                )
        if added is not None:
            return {
                "files": len(prints),
                "files_read": len(tasks),
                "lines": result.lines,
                "bad_lines": result.bad_lines,
                "requests_counted": result.counted_requests,
                "new_downloads": added,
                "file_errors": refused + result.errors,
            }
    raise RetryJob("other stats_parse runs kept committing the same logs; trying again later")


def _fingerprints(logs: list[LogFile]) -> tuple[dict[LogFile, str], list[str]]:
    """Each readable log's fingerprint, and why a log was refused (`open_in_folder`)."""
    found = {}
    refused = []
    for log in logs:
        try:
            fp = fingerprint(log.path, log.folder)
        except (UnsafeFile, NoLogText) as exc:
            refused.append(utf8_text(f"{log.path.name}: {exc}"))
            continue
        except FileNotFoundError:
            continue  # rotated or removed since it was listed; its text is read under its new name
        except (OSError, EOFError, zstandard.ZstdError):
            continue  # unreadable or not yet fully compressed: its source file is still there
        if fp is not None:
            found[log] = fp
    return found, refused


def plan(
    logs: list[LogFile], prints: dict[LogFile, str], states: dict[str, stats_store.FileState]
) -> tuple[list[FileTask], list[FileSave]]:
    """What to read from where; files already read to the end are only touched (kept known).
    Two names with one fingerprint (the live file and its fresh rotation) are read once."""
    tasks: list[FileTask] = []
    saves: list[FileSave] = []
    seen: set[str] = set()
    for log in logs:
        fp = prints.get(log)
        if fp is None or fp in seen:
            continue
        seen.add(fp)
        state = states.get(fp)
        if state is not None and state.complete:
            saves.append(FileSave(fp, utf8_text(log.path.name), state.read_offset, True))
        else:
            start = state.read_offset if state else 0
            tasks.append(FileTask(log.path, log.rotated, fp, start, log.folder))
    return tasks, saves


async def parse_in_child(
    tasks: list[FileTask], rules: EpisodeRules, spill_dir: Path | None = None
) -> ParseResult:
    """The CPU-bound parse in a child process, killed if this job is cancelled or times out.
    With `spill_dir`, listeners past SPILL_LISTENERS go to sorted files there (memory stays
    bounded); the caller removes the folder after reading them."""
    if not tasks:
        return ParseResult()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "sidelinja_worker.jobs.stats.child",
        str(os.getpid()),  # it ends once this process is gone (child.exit_with_parent)
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        spill_at = SPILL_LISTENERS if spill_dir is not None else None
        # Tomorrow by the database's clock, for logs written by clocks a little ahead.
        last_day = int(clock.time() // DAY_S) + 1
        out, err = await proc.communicate(
            pickle.dumps((tasks, rules, spill_dir, spill_at, last_day))
        )
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    if proc.returncode != 0:
        raise RetryJob(
            f"log parser exited with {proc.returncode}: {err.decode(errors='replace')[-300:]}"
        )
    # Our own child's output; a big log's result takes ~0.5 s to unpickle, which must not
    # stall the other jobs on the event loop.
    result = await asyncio.to_thread(pickle.loads, out)
    if isinstance(result, tuple):
        raise PermanentError(f"reading the logs failed: {result[1]}")
    return result


def _thresholds(
    result: ParseResult, media_root: Path, settings: StatsSettings
) -> dict[str, int | None]:
    return {
        ep: threshold_bytes(
            _media_file(media_root, settings, result.paths.get(ep)),
            result.sizes.get(ep),
            media_root,
        )
        for ep in result.episodes
    }


def _media_file(media_root: Path, settings: StatsSettings, url_path: str | None) -> Path | None:
    """Where the episode's file would be. Not resolved here: `threshold_bytes` opens it with
    `open_in_folder`, which refuses a path out of `media_root` and one through a symlink loop
    (resolving raised RuntimeError for a loop, which failed every run)."""
    if url_path is None or not url_path.startswith(settings.url_prefix):
        return None
    return media_root / settings.media_dir / url_path[len(settings.url_prefix) :].lstrip("/")


async def _row_batches(
    result: ParseResult, salts: dict[date, bytes], country: Callable[[str], str]
) -> AsyncIterator[list[ListenRow]]:
    """The run's listeners, ROW_BATCH at a time, with the address and agent replaced by a keyed
    hash under the day's salt: the raw IP never leaves this process's memory. Read and hashed
    in a thread, a batch at a time (a spilled parse's file is read as it goes)."""
    chunks = result.listen_batches()
    while True:
        rows = await asyncio.to_thread(_hash_batch, chunks, salts, country)
        if not rows:
            return
        yield rows


_EPOCH = date(1970, 1, 1).toordinal()


def _hash_batch(
    chunks: Iterator[list[Record]], salts: dict[date, bytes], country: Callable[[str], str]
) -> list[ListenRow]:
    rows: list[ListenRow] = []
    for chunk in chunks:
        for day_n, episode, ip, agent, family, sent, whole in chunk:
            day = date.fromordinal(_EPOCH + day_n)
            key = hashlib.blake2b(
                f"{ip}\n{agent}".encode(), digest_size=16, key=salts[day]
            ).digest()
            sent = min(sent, MAX_LISTENER_BYTES)
            rows.append(ListenRow(day, episode, key, family, country(ip), sent, whole))
        if len(rows) >= ROW_BATCH:
            break
    return rows


def _schedule_next(ctx: JobContext, payload: StatsParsePayload, interval_s: float) -> datetime:
    """Enqueues the next run at the next interval boundary, under a key naming the workspace,
    the logs and that time: every run that ends in the same interval schedules the same job,
    and the unique index keeps one."""
    now_s = clock.time()  # the database's: it runs the job when its own clock gets there
    next_time = datetime.fromtimestamp((now_s // interval_s + 1) * interval_s, UTC)
    logs_id = hashlib.sha256(payload.logs.encode()).hexdigest()[:12]
    ctx.enqueue_on_success(
        NewJob(
            ctx.workspace_id,
            "stats_parse",
            payload.model_dump(),
            scheduled_for=next_time,
            unique_key=f"stats_parse:{ctx.workspace_id}:{logs_id}:{next_time:%Y-%m-%dT%H:%M}",
        )
    )
    return next_time


JOB_TYPE = JobType(
    name="stats_parse",
    handler=run,
    payload_model=StatsParsePayload,
    default_priority=default_priority("stats_parse"),
    timeout_s=3600,
    description="Caddy access logs -> daily podcast downloads (IAB rules); {logs, schedule}",
    needs_settings=("MEDIA_ROOT",),
)
