"""`sidelinja-worker top` in a real pseudo-terminal (tmux): the screen shows the queue and the
workers and follows changes; Ctrl-C ends it."""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import subprocess
import sys
import time
from uuid import UUID, uuid4

import asyncpg
import pytest

from sidelinja_worker.jobs.catalog import REGISTRY
from sidelinja_worker.queue import store
from tests.helpers import cli, insert_jobs

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


def _tmux(socket: str, *args: str) -> str:
    return subprocess.run(
        ["tmux", "-L", socket, *args], capture_output=True, text=True, check=False
    ).stdout


async def _screen_shows(socket: str, *texts: str, timeout_s: float = 30) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        screen = _tmux(socket, "capture-pane", "-p", "-t", "top")
        if all(t in screen for t in texts):
            return screen
        assert time.monotonic() < deadline, f"{texts} not on screen:\n{screen}"
        await asyncio.sleep(0.1)


async def test_top_shows_the_queue_and_workers_live(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    await insert_jobs(pool, workspace, 7, job_type_name="srt_parse")
    await store.register_worker(pool, uuid4(), "render-7", 4711, ["srt_parse"], 600, "0.1.0", 4)
    await store.pause_type(pool, "srt_parse", "ops", "test")
    socket = f"sidelinja-top-{os.getpid()}"
    command = (
        f"DATABASE_URL={shlex.quote(db_url)} {shlex.quote(sys.executable)} "
        "-m sidelinja_worker top --interval 0.3"
    )
    _tmux(socket, "new-session", "-d", "-s", "top", "-x", "150", "-y", "40", command)
    try:
        screen = await _screen_shows(socket, "render-7", "4711", "srt_parse", "PAUSED")
        assert "queue depth 7" in screen
        await insert_jobs(pool, workspace, 5, job_type_name="srt_parse")
        await _screen_shows(socket, "queue depth 12")
        _tmux(socket, "send-keys", "-t", "top", "C-c")
        deadline = time.monotonic() + 15
        while "top" in _tmux(socket, "list-sessions"):
            assert time.monotonic() < deadline, "top did not end on Ctrl-C"
            await asyncio.sleep(0.1)
    finally:
        _tmux(socket, "kill-server")


async def test_once_says_nothing_is_due_rather_than_a_wait_of_zero(
    db_url: str, pool: asyncpg.Pool, workspace: UUID
) -> None:
    await pool.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload, scheduled_for)"
        " VALUES ($1, 'noop', '{}', now() + interval '1 hour')",
        workspace,
    )
    later = cli("top", "--once", url=db_url)
    assert later.returncode == 0, later.stderr
    assert "nothing due" in later.stdout and "oldest due" not in later.stdout
    await pool.execute("UPDATE job_queue SET scheduled_for = now() - interval '90 seconds'")
    due = cli("top", "--once", url=db_url)
    assert "oldest due 9" in due.stdout and "nothing due" not in due.stdout


async def test_once_shows_a_worker_of_every_type_as_all(db_url: str, pool: asyncpg.Pool) -> None:
    await pool.execute(
        "INSERT INTO job_workers (id, hostname, pid, job_types, expires_at)"
        " VALUES ($1, 'h', 1, $2, now() + interval '1 hour')",
        uuid4(),
        sorted(REGISTRY),
    )
    out = cli("top", "--once", url=db_url, env={"COLUMNS": "80"})
    assert out.returncode == 0, out.stderr
    (row,) = [line for line in out.stdout.splitlines() if line.startswith("│ live ")]
    assert row.split("│")[5].strip() == "all", row


async def test_once_fits_80_columns_and_breaks_the_header_between_its_parts(
    db_url: str, pool: asyncpg.Pool, workspace: UUID
) -> None:
    """At 80 columns the header ran to two lines broken between two words ("1" and "live
    workers")."""
    await insert_jobs(pool, workspace, 3, job_type_name="valgomat_generate_profile")
    await store.register_worker(
        pool, uuid4(), "render-worker-7.example.org", 123456, ["srt_parse"], 600, "0.1.0", 8
    )
    out = cli("top", "--once", url=db_url, env={"COLUMNS": "80"})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80, out.stdout
    header = lines[: next(i for i, line in enumerate(lines) if "Jobs (" in line)]
    parts = [part for line in header for part in line.strip().split(" · ")]
    assert parts[0] == "sidelinja-worker top" and parts[-1] == "Ctrl-C to quit", header
    assert {"queue depth 3", "1 live workers"} <= set(parts), header
    assert any(part.startswith("oldest due ") for part in parts), header


def _type_cells(stdout: str) -> list[str]:
    """The type column of the jobs table of `top --once`."""
    table = stdout.split("Jobs (", 1)[1].split("Workers", 1)[0]
    return [line.split("│")[1].strip() for line in table.splitlines() if line.startswith("│")]


async def test_once_names_100_types_and_counts_the_rest_in_one_row(
    db_url: str, pool: asyncpg.Pool, workspace: UUID
) -> None:
    """A plain-SQL writer's types, waiting and paused, as many as it likes: 100 rows by name,
    the busiest, and one for the rest."""
    await pool.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload)"
        " SELECT $1, 'w_' || lpad(g::text, 3, '0'), '{}' FROM generate_series(0, 149) g",
        workspace,
    )
    await pool.execute(
        "INSERT INTO job_type_pauses (job_type, paused_by)"
        " SELECT 'p_' || lpad(g::text, 3, '0'), 'test' FROM generate_series(0, 149) g"
    )
    out = cli("top", "--once", url=db_url, env={"COLUMNS": "100"})
    assert out.returncode == 0, out.stderr
    cells = _type_cells(out.stdout)
    assert cells == [f"w_{n:03d}" for n in range(100)] + ["(other types)"], cells
    (other,) = [line for line in out.stdout.splitlines() if "(other types)" in line]
    assert other.split("│")[2].strip() == "50", other


async def test_once_prints_a_long_job_type_on_one_line(
    db_url: str, pool: asyncpg.Pool, workspace: UUID
) -> None:
    await pool.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload)"
        " VALUES ($1, 'x' || repeat('ab cd ', 200000), '{}'), ($1, 'noop', '{}')",
        workspace,
    )
    out = cli("top", "--once", url=db_url, env={"COLUMNS": "80"})
    assert out.returncode == 0, out.stderr
    cells = _type_cells(out.stdout)
    assert len(cells) == 2 and cells[0] == "noop" and cells[1].startswith("xab cd"), cells
    assert cells[1].endswith("…") and len(out.stdout.splitlines()) < 30
