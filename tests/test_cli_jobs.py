"""`jobs list` as a script and an operator meet it: JSON a parser takes, limits said plainly."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import struct
import subprocess
import sys
import termios
from datetime import datetime
from uuid import UUID

import asyncpg
import pytest

from tests.helpers import cli, one_line_error


@pytest.mark.parametrize("limit", ["0", "-1"])
async def test_a_limit_below_one_is_refused(db_url: str, limit: str) -> None:
    out = cli("jobs", "list", "--limit", limit, url=db_url)
    assert out.returncode == 2
    assert one_line_error(out) == "sidelinja-worker: error: --limit: 1 to 100,000"


async def test_json_times_are_iso_8601_as_jobs_show_gives_them(
    db_url: str, pool: asyncpg.Pool, workspace: UUID
) -> None:
    job_id = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload) VALUES ($1, 'noop', '{}') RETURNING id",
        workspace,
    )
    listed = cli("jobs", "list", "--status", "all", "--json", url=db_url)
    assert listed.returncode == 0, listed.stderr
    (row,) = json.loads(listed.stdout)
    shown = json.loads(cli("jobs", "show", str(job_id), url=db_url).stdout)
    assert row["created_at"] == shown["created_at"]
    assert "T" in row["created_at"] and datetime.fromisoformat(row["created_at"]).tzinfo


def test_the_help_names_every_status() -> None:
    text = " ".join(cli("jobs", "list", "--help", url=None).stdout.split())
    assert "error, retry, pending, waiting, running, completed, cancelled or all" in text
    assert "then retry, running, pending, waiting, cancelled, completed" in " ".join(
        cli("jobs", "--help", url=None).stdout.split()
    )


async def test_the_table_shows_each_job_type_whole_and_marks_a_cut_error(
    db_url: str, pool: asyncpg.Pool, workspace: UUID
) -> None:
    await pool.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload, status, error_msg)"
        " VALUES ($1, 'valgomat_generate_profile', '{}', 'error', repeat('x', 100)),"
        "        ($1, 'noop', '{}', 'error', 'short')",
        workspace,
    )
    out = cli("jobs", "list", url=db_url)
    assert out.returncode == 0, out.stderr
    header, *rows = out.stdout.splitlines()
    by_type = {row.split()[1]: row for row in rows}
    assert sorted(by_type) == ["noop", "valgomat_generate_profile"]
    assert {row.index(" error ") for row in rows} == {header.index("STATUS") - 1}
    assert by_type["valgomat_generate_profile"].endswith(" " + "x" * 59 + "…")
    assert by_type["noop"].endswith(" short")


FIRST, SECOND = (UUID(f"01900000-0000-7000-8000-0000000000{end}") for end in ("a1", "b2"))


def at_terminal(*args: str, url: str, columns: int = 80) -> tuple[int, str]:
    """`sidelinja-worker ARGS` with its stdout on a terminal `columns` wide: its exit code and
    what the terminal got, lines ending in "\\n"."""
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "sidelinja_worker", *args],
        env={**env, "DATABASE_URL": url},
        stdout=terminal,
        stderr=subprocess.DEVNULL,
    )
    os.close(terminal)
    got = b""
    try:
        while chunk := os.read(controller, 65536):
            got += chunk
    except OSError:  # EIO: the process closed its end of the terminal
        pass
    finally:
        os.close(controller)
    return proc.wait(timeout=120), got.decode().replace("\r\n", "\n")


async def _two_jobs(pool: asyncpg.Pool, workspace: UUID) -> None:
    await pool.execute(
        "INSERT INTO job_queue (id, workspace_id, job_type, payload, status, error_msg)"
        " VALUES ($1, $3, 'valgomat_generate_profile', '{}', 'error', repeat('x', 100)),"
        "        ($2, $3, 'noop', '{}', 'error', 'short')",
        FIRST,
        SECOND,
        workspace,
    )


@pytest.mark.parametrize("columns", [80, 100])
async def test_the_table_fits_a_terminal_with_short_ids_and_a_pipe_gets_whole_ones(
    db_url: str, pool: asyncpg.Pool, workspace: UUID, columns: int
) -> None:
    """Every row took 97 columns or more (a whole id is 36), so an 80-column terminal wrapped
    each one."""
    await _two_jobs(pool, workspace)
    code, shown = at_terminal("jobs", "list", url=db_url, columns=columns)
    assert code == 0, shown
    assert max(len(line) for line in shown.splitlines()) <= columns, shown
    assert "01900000…0000a1  valgomat_generate_profile error" in shown, shown
    assert "01900000…0000b2  noop" in shown and str(FIRST) not in shown, shown
    assert "x" * 20 in shown and "short" in shown, shown  # each error, in its room
    piped = cli("jobs", "list", url=db_url)
    assert piped.returncode == 0, piped.stderr
    assert str(FIRST) in piped.stdout and str(SECOND) in piped.stdout


@pytest.mark.parametrize(
    "given", ["01900000…0000a1", "01900000...0000A1", "01900000-0000-7000-8000-0000000000a", "019000000000700080000000000000a"]
)  # fmt: skip
async def test_a_short_id_or_a_start_names_the_job(
    db_url: str, pool: asyncpg.Pool, workspace: UUID, given: str
) -> None:
    await _two_jobs(pool, workspace)
    shown = cli("jobs", "show", given, url=db_url)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["id"] == str(FIRST)
    why = cli("jobs", "why", given, url=db_url)
    assert why.returncode == 0, why.stderr
    retried = cli("jobs", "retry", given, url=db_url)
    assert retried.returncode == 0, retried.stderr
    cancelled = cli("jobs", "cancel", given, url=db_url)
    assert (cancelled.returncode, cancelled.stdout) == (0, "cancelled\n"), cancelled.stderr
    assert await pool.fetchval("SELECT status::text FROM job_queue WHERE id = $1", FIRST) == (
        "cancelled"
    )
    assert await pool.fetchval("SELECT status::text FROM job_queue WHERE id = $1", SECOND) == (
        "error"
    )


@pytest.mark.parametrize("action", ["show", "why", "cancel", "retry"])
async def test_an_ambiguous_unknown_or_malformed_id_is_refused_in_one_line(
    db_url: str, pool: asyncpg.Pool, workspace: UUID, action: str
) -> None:
    await _two_jobs(pool, workspace)
    ambiguous = cli("jobs", action, "0190", url=db_url)
    assert ambiguous.returncode == 2
    assert one_line_error(ambiguous) == (
        f"sidelinja-worker: error: job id 0190 is ambiguous: {FIRST}, {SECOND}; give more of "
        "its digits"
    )
    unknown = cli("jobs", action, "01900000…0000c3", url=db_url)
    assert unknown.returncode == 2
    assert one_line_error(unknown) == "sidelinja-worker: error: no job 01900000…0000c3"
    malformed = cli("jobs", action, "019", url=db_url)
    assert malformed.returncode == 2
    assert one_line_error(malformed) == (
        "sidelinja-worker: error: job id '019' is not one: give it whole, its first 4 or more "
        "hex digits, or the short form `jobs list` prints"
    )
    assert await pool.fetchval("SELECT count(*) FROM job_queue WHERE status = 'error'") == 2
