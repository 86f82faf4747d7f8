"""stats_parse with bounded memory: listeners past a threshold spill to sorted files and are
merged back, giving exactly the totals of an all-in-memory parse; a compressed log that
expands like a decompression bomb fails permanently, naming the file."""

from __future__ import annotations

import gzip
import random
from pathlib import Path
from typing import Any
from uuid import UUID

import asyncpg
import pytest

from sidelinja_worker.jobs.stats import stats_parse
from sidelinja_worker.jobs.stats import store as stats_store
from sidelinja_worker.jobs.stats.counting import EpisodeRules
from sidelinja_worker.jobs.stats.logfiles import MAX_EXPANSION_RATIO
from sidelinja_worker.jobs.stats.parse import FileTask, ParseResult, parse_files
from sidelinja_worker.jobs.stats.spill import (
    MAX_LISTENER_BYTES,
    merge_runs,
    read_records,
    write_records,
)
from sidelinja_worker.queue import client, store
from sidelinja_worker.queue.config import ServiceConfig
from tests.helpers import run_burst
from tests.test_stats_counting import APPLE, SIZE, SPOTIFY
from tests.test_stats_job import ln

AGENTS = [APPLE, SPOTIFY, "Overcast/3.0 (+http://overcast.fm/; iOS podcast app)", "Googlebot/2.1"]


def _flood(seed: int, lines: int) -> bytes:
    """A log where most lines are new listeners, some come back (within and across days, so
    a listener's ranges straddle spills), with 200s and 206s on two episodes."""
    rng = random.Random(seed)
    out = []
    for i in range(lines):
        n = rng.randrange(lines // 2)
        whole = rng.random() < 0.2
        out.append(
            ln(
                ts=rng.choice((10, 3600, 86400 + 10)) + i * 0.001,
                ip=f"198.51.{n // 250}.{n % 250}" if n % 3 else f"2001:db8:{n:x}::1",
                ua=f"{rng.choice(AGENTS)} build/{n % 97}",
                uri=rng.choice(("/podcast/ep1.mp3", "/podcast/ep2.mp3")),
                status=200 if whole else 206,
                range_=None if whole else "auto",
                start=rng.randrange(4) * 1_000_000,
                size=SIZE if whole else 1_000_000,
            )
        )
    return b"".join(out)


def _everything(result: ParseResult) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    return {r[:4]: r[4:] for batch in result.listen_batches() for r in batch}


def test_a_spilled_parse_gives_the_totals_of_an_in_memory_one(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    log.write_bytes(_flood(1, 3000))
    tasks = [FileTask(log, False, "fp", 0)]
    whole = parse_files(tasks, EpisodeRules())
    (tmp_path / "spill").mkdir()
    spilled = parse_files(tasks, EpisodeRules(), tmp_path / "spill", spill_at=40)

    assert whole.spill is None and spilled.spill == str(tmp_path / "spill" / "listeners")
    assert spilled.listens == {}  # nothing held in memory past the threshold
    assert [p.name for p in (tmp_path / "spill").iterdir()] == ["listeners"]  # runs removed
    assert len(whole.listens) > 1000 and spilled.listeners == len(whole.listens)
    assert _everything(spilled) == _everything(whole)
    assert (spilled.days, spilled.episodes) == (whole.days, whole.episodes)
    assert (spilled.lines, spilled.counted_requests, spilled.sizes) == (
        whole.lines,
        whole.counted_requests,
        whole.sizes,
    )


async def test_a_spilling_job_counts_what_an_in_memory_job_counts(
    pool: asyncpg.Pool,
    db_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spilled_runs: list[bool] = []
    parse = stats_parse.parse_in_child

    async def recording(*args: Any) -> ParseResult:
        result = await parse(*args)
        spilled_runs.append(result.spill is not None)
        return result

    monkeypatch.setattr(stats_parse, "parse_in_child", recording)
    daily = {}
    for spill_at in (stats_parse.SPILL_LISTENERS, 25):
        monkeypatch.setattr(stats_parse, "SPILL_LISTENERS", spill_at)
        ws = await pool.fetchval("INSERT INTO workspaces (name) VALUES ('w') RETURNING id")
        logs = tmp_path / str(ws) / "logs"
        logs.mkdir(parents=True)
        (logs / "access.log").write_bytes(_flood(2, 1500))
        job_id = await client.enqueue(pool, ws, "stats_parse", {"logs": "logs", "schedule": False})
        await run_burst(pool, db_url, config=ServiceConfig({"MEDIA_ROOT": str(tmp_path)}))
        row = await store.get_job(pool, job_id)
        assert row is not None and row["status"] == "completed", row["error_msg"]
        daily[spill_at] = [
            (r.day, r.episode, r.app, r.downloads)
            for r in await stats_store.daily_downloads(pool, ws)
        ]
    in_memory, spilled = daily.values()
    assert sum(r[3] for r in in_memory) > 100
    assert spilled == in_memory
    assert spilled_runs == [False, True]


async def test_a_decompression_bomb_fails_naming_the_file(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, tmp_path: Path
) -> None:
    logs = tmp_path / str(workspace) / "logs"
    logs.mkdir(parents=True)
    (logs / "access.log").write_bytes(ln())
    bomb = logs / "access-2026-03-01T06-00-00.000.log.gz"
    # The fingerprint is a real line; then 40 MB of newlines, ~40 KB compressed (~1000x).
    bomb.write_bytes(gzip.compress(ln(ts=7200) + b"\n" * 40_000_000, compresslevel=9))
    job_id = await client.enqueue(pool, workspace, "stats_parse", {"logs": "logs"})
    await run_burst(pool, db_url, config=ServiceConfig({"MEDIA_ROOT": str(tmp_path)}))
    row = await store.get_job(pool, job_id)
    assert row is not None
    assert (row["status"], row["attempts"]) == ("error", 1)
    assert row["error_msg"] == (
        f"reading the logs failed: LogBomb: {bomb.name} expands to more than 16777216 bytes "
        f"({MAX_EXPANSION_RATIO} times its compressed size): not a log, refused"
    )
    assert await stats_store.daily_downloads(pool, workspace) == []


def test_summed_bytes_stop_at_bigints_top(tmp_path: Path) -> None:
    # Three runs of one listener, each 2^62 bytes: their sum passed msgpack's integers and
    # PostgreSQL's BIGINT, and failed the run, every run.
    record = (1, "ep", "203.0.113.9", "agent", "app", 1 << 62, False)
    runs = []
    for i in range(3):
        run = tmp_path / f"run-{i}"
        write_records(run, [record])
        runs.append(run)
    out = tmp_path / "merged"
    assert merge_runs(runs, out) == 1
    [merged] = list(read_records(out))
    assert merged[5] == MAX_LISTENER_BYTES == (1 << 63) - 1
