"""Absurd and hostile values given to the CLI: each is one clear line and exit code 2, never a
traceback, a hang or memory that grows with the input."""

from __future__ import annotations

import subprocess
from pathlib import Path
from uuid import UUID

import asyncpg
import pytest

from tests.helpers import cli, one_line_error

DEEP = "[" * 100_000
BIG_INT = "1" + "0" * 100  # past the 64 bits jsonb's encoder writes
HUGE_INT = "1" + "0" * 5000  # past Python's 4,300 digits for int()


async def refused(out: subprocess.CompletedProcess[str], says: str, pool: asyncpg.Pool) -> None:
    """The command failed with exit code 2 and one line saying `says`, enqueueing nothing."""
    error = one_line_error(out)
    assert says in error, error
    assert out.returncode == 2
    assert await pool.fetchval("SELECT count(*) FROM job_queue") == 0


@pytest.mark.parametrize(
    ("payload", "says"),
    [
        ('{"a": ' + DEEP, "--payload is not JSON"),
        ('{"a": "\\ud800"}', "--payload is not JSON"),
        ('{"a": ' + HUGE_INT + "}", "--payload is not JSON"),
        ('{"a": "x\\u0000y"}', "payload.a: a NUL character"),
        ('{"a\\u0000": 1}', "payload: a NUL character"),
        ('{"a": [1, ' + BIG_INT + "]}", "payload.a.1: a whole number past 64 bits"),
        ('{"a": NaN}', "payload.a: not a finite number"),
        ('{"a": 1e999}', "payload.a: not a finite number"),
    ],
)
async def test_a_payload_the_database_cannot_store_is_one_clear_error(
    db_url: str, pool: asyncpg.Pool, workspace: UUID, payload: str, says: str
) -> None:
    out = cli("enqueue", "noop", "--workspace", str(workspace), "--payload", payload, url=db_url)
    await refused(out, says, pool)


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ('{"payload": {"a": "\\u0000"}}', "line 1: payload.a: a NUL character"),
        ('{"payload": {"a": ' + BIG_INT + "}}", "line 1: payload.a: a whole number past 64 bits"),
        ('{"payload": {"a": NaN}}', "line 1: payload.a: not a finite number"),
        (
            '{"timeout_s": 9999999999999}',
            "line 1: timeout_s: Input should be less than or equal to 2147483647",
        ),
        ('{"scheduled_for": "0001-01-01T00:00+14:00"}', "line 1: scheduled_for"),
    ],
)
async def test_a_bulk_line_the_database_cannot_store_is_one_clear_error(
    db_url: str, pool: asyncpg.Pool, workspace: UUID, tmp_path: Path, line: str, says: str
) -> None:
    path = tmp_path / "jobs.jsonl"
    path.write_text(line + "\n", encoding="utf-8")
    out = cli("enqueue", "noop", "--workspace", str(workspace), "--file", str(path), url=db_url)
    await refused(out, says, pool)


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (("--at", "0001-01-01T00:00+14:00"), "--at '0001-01-01T00:00+14:00' is out of range"),
        (("--at", "9999-12-31T23:59-14:00"), "--at '9999-12-31T23:59-14:00' is out of range"),
        (("--in", "99999999999d"), "--in: at most 36500d"),
        (("--timeout", "99999999999d"), "--timeout must be 1 to 2147483647 seconds"),
    ],
)
async def test_a_time_past_what_the_database_holds_is_one_clear_error(
    db_url: str, pool: asyncpg.Pool, workspace: UUID, flags: tuple[str, str], says: str
) -> None:
    out = cli("enqueue", "noop", "--workspace", str(workspace), *flags, url=db_url)
    await refused(out, says, pool)


@pytest.mark.parametrize(
    "args",
    [
        ("limits", "type", "noop", "²"),  # str.isdigit says yes, int() says no
        ("limits", "type", "noop", "9" * 5000),
        ("limits", "rate", "ai_gateway", "²/1m"),
        ("limits", "rate", "ai_gateway", "9" * 5000 + "/1m"),
        ("jobs", "list", "--limit", "99999999999999999999"),
    ],
)
async def test_an_absurd_number_is_one_clear_error(db_url: str, args: tuple[str, ...]) -> None:
    out = cli(*args, url=db_url)
    one_line_error(out)
    assert out.returncode == 2
