"""A worker on a machine whose clock is wrong keeps the queue's times on the database's clock.

The worker runs as a process under libfaketime, its clock two days behind or ahead of the
machine's (and of PostgreSQL's, on the same machine): the times it computes and writes (a
deferral's due time, the next run of the download statistics, the dashboard's minute, the
last day a download may have) must be the database's. Skipped where libfaketime is not
installed (Debian: `apt-get install faketime`; CI installs it)."""

from __future__ import annotations

import glob
import os
import signal
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from uuid import UUID

import asyncpg
import pytest

from sidelinja_worker.queue import client, clock
from tests.helpers import SPAWNED, Spawned, wait_for_sql
from tests.test_stats_counting import SIZE, line

FAKETIME = next(iter(sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))), None)
pytestmark = pytest.mark.skipif(FAKETIME is None, reason="libfaketime is not installed")

DEFER_S = 600.0

# `sidelinja-worker run` with one more job type, which defers itself DEFER_S seconds.
WORKER = f"""
import sys
from sidelinja_worker.jobs import catalog
from sidelinja_worker.queue.errors import Defer
from sidelinja_worker.queue.registry import Registry
from tests.helpers import job_type

async def _later(ctx, payload):
    raise Defer("not yet", after_s={DEFER_S})

catalog.REGISTRY = Registry([*catalog.REGISTRY.values(), job_type("clock_later", _later)])
from sidelinja_worker.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def _skewed_worker(db_url: str, skew: str, media_root: Path) -> Spawned:
    env = {
        **os.environ,
        "DATABASE_URL": db_url,
        "MEDIA_ROOT": str(media_root),
        "SIDELINJA_LOG_FORMAT": "text",
        "LD_PRELOAD": str(FAKETIME),
        "FAKETIME": skew,
        # asyncio's timers run on the monotonic clock, which a wrong wall clock leaves alone.
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }
    proc = Spawned([sys.executable, "-c", WORKER, "run", "--max-concurrent", "4"], env)
    SPAWNED.append(proc)
    return proc


def test_faketime_moves_a_process_clock() -> None:
    """The premise: the process below runs two days behind."""
    import subprocess

    out = subprocess.run(
        [sys.executable, "-c", "import time; print(time.time())"],
        env={**os.environ, "LD_PRELOAD": str(FAKETIME), "FAKETIME": "-2d"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert abs(float(out) - (time.time() - 2 * 86400)) < 60


@pytest.mark.parametrize("skew", ["-2d", "+2d"])
async def test_a_worker_with_a_wrong_clock_keeps_the_queues_times_on_the_databases(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, tmp_path: Path, skew: str
) -> None:
    """Before, a worker two days behind deferred a job into the database's past (claimed and
    deferred again at once, for two days), scheduled the next statistics run in the past,
    wrote its minutes two days back and took today's downloads for ones from the future; a
    worker ahead deferred two days longer than asked."""
    media = tmp_path / "media"
    now_s = time.time()
    logs = media / str(workspace) / "logs"
    logs.mkdir(parents=True)
    # A whole download a minute ago.
    (logs / "access.log").write_bytes(line(ts=now_s - 60, status=200, range_=None, size=SIZE))
    later = await client.enqueue(pool, workspace, "clock_later", {})
    stats = await client.enqueue(pool, workspace, "stats_parse", {"logs": "logs"})
    noop = await client.enqueue(pool, workspace, "noop", {})
    worker = _skewed_worker(db_url, skew, media)
    try:
        await wait_for_sql(
            pool, "SELECT progress ? 'deferred_until' FROM job_queue WHERE id = $1", later
        )
        await wait_for_sql(
            pool,
            "SELECT bool_and(status IN ('completed', 'error')) FROM job_queue WHERE id = ANY($1)",
            [stats, noop],
        )
        # The deferral: due DEFER_S after the database's now, and claimed once.
        due_in = await pool.fetchval(
            "SELECT extract(epoch FROM scheduled_for - now())::float8 FROM job_queue WHERE id = $1",
            later,
        )
        assert DEFER_S - 60 < due_in <= DEFER_S, due_in
        # The statistics: today's download counted, the next run within the hour.
        result = await pool.fetchval("SELECT result FROM job_queue WHERE id = $1", stats)
        assert (result["bad_lines"], result["new_downloads"]) == (0, 1), result
        next_in = await pool.fetchval(
            "SELECT extract(epoch FROM scheduled_for - now())::float8 FROM job_queue"
            " WHERE job_type = 'stats_parse' AND status = 'pending'"
        )
        assert next_in is not None and 0 < next_in <= 3600, next_in
    finally:
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(60)
    assert worker.returncode == 0, err[-2000:]
    # The dashboard's minute of the noop job (written at the latest as the worker stopped).
    minute = await pool.fetchval("SELECT max(minute) FROM job_minute_stats WHERE job_type = 'noop'")
    db_now = await pool.fetchval("SELECT now()")
    assert minute is not None and abs((db_now - minute).total_seconds()) < 180, (minute, db_now)


def test_the_offset_is_read_at_the_middle_of_the_round_trip() -> None:
    clock.reset()
    try:
        sent = time.time()
        clock.observe(datetime.fromtimestamp(sent + 3600.05, UTC), sent, sent + 0.1)
        assert abs(clock.offset_s() - 3600) < 1e-3
        # A slow reading does not replace a good one; the first is taken whatever it took.
        clock.observe(datetime.fromtimestamp(sent, UTC), sent, sent + 5)
        assert abs(clock.offset_s() - 3600) < 1e-3
        assert abs((clock.now() - datetime.now(UTC)).total_seconds() - 3600) < 1
    finally:
        clock.reset()
