"""Absurd and hostile values given to the CLI: each is one clear line and exit code 2, never a
traceback, a hang or memory that grows with the input."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from uuid import UUID

import asyncpg
import pytest

from sidelinja_worker.cli.bulk import MAX_LINE_BYTES
from tests.helpers import cli, contend_unique_key, one_line_error

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


# Runs a command and writes the peak memory of it alone (in KiB) to the file named first. A
# child's peak counts the memory of the process that forked it, so a small parent measures it.
PEAK_OF = (
    "import resource, subprocess, sys; rc = subprocess.call(sys.argv[2:]); "
    "open(sys.argv[1], 'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)); "
    "sys.exit(rc)"
)


def _enqueue_from(db_url: str, workspace: UUID, stdin: Path, *more: str) -> Finished:
    """`enqueue noop --file - ...` reading the file `stdin`, as a real process; its own peak
    memory."""
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"} | {"DATABASE_URL": db_url}
    args = [sys.executable, "-m", "sidelinja_worker", "enqueue", "noop", "--file", "-", *more]
    with tempfile.NamedTemporaryFile("r") as peak, stdin.open("rb") as given:
        done = subprocess.run(
            [sys.executable, "-c", PEAK_OF, peak.name, *args, "--workspace", str(workspace)],
            env=env,
            stdin=given,
            capture_output=True,
            text=True,
            timeout=300,
        )
        return Finished(done, int(peak.read()) * 1024)


@dataclass(frozen=True)
class Finished:
    proc: subprocess.CompletedProcess[str]
    peak_bytes: int


async def test_millions_of_bad_lines_are_counted_not_kept(
    db_url: str, workspace: UUID, tmp_path: Path
) -> None:
    few, many = tmp_path / "few.jsonl", tmp_path / "many.jsonl"
    few.write_bytes(b"x\n" * 100)
    many.write_bytes(b"x\n" * 1_000_000)
    small = _enqueue_from(db_url, workspace, few, "--skip-bad")
    big = _enqueue_from(db_url, workspace, many, "--skip-bad")
    assert big.proc.returncode == 1, big.proc.stderr
    assert big.proc.stdout.endswith("skipped 1000000 bad lines (listed above)\n"), big.proc.stdout
    assert big.proc.stderr.count("skipped stdin line") == 50
    # Before, each bad line's name was kept: ~86 MB more for the million.
    assert big.peak_bytes - small.peak_bytes < 20_000_000, (big.peak_bytes, small.peak_bytes)


async def test_a_workspace_per_line_is_looked_up_without_keeping_every_answer(
    db_url: str, workspace: UUID, tmp_path: Path
) -> None:
    few, many = tmp_path / "few.jsonl", tmp_path / "many.jsonl"
    few.write_bytes(b"x\n" * 100)
    many.write_text(
        "".join(f'{{"workspace_id": "{UUID(int=i)}"}}\n' for i in range(1, 60_001)),
        encoding="utf-8",
    )
    small = _enqueue_from(db_url, workspace, few, "--skip-bad")
    big = _enqueue_from(db_url, workspace, many, "--skip-bad")
    assert big.proc.stdout.endswith("skipped 60000 bad lines (listed above)\n"), big.proc.stdout
    assert "line 60000: no workspace" not in big.proc.stderr  # past the 50 listed
    # Before, every workspace id's answer was kept: ~36 MB more for 200,000.
    assert big.peak_bytes - small.peak_bytes < 5_000_000, (big.peak_bytes, small.peak_bytes)


@pytest.mark.parametrize("skip_bad", [(), ("--skip-bad",)])
async def test_a_device_that_never_ends_is_refused(
    db_url: str, pool: asyncpg.Pool, workspace: UUID, skip_bad: tuple[str, ...]
) -> None:
    out = cli(
        *("enqueue", "noop", "--workspace", str(workspace), "--file", "/dev/zero", *skip_bad),
        url=db_url,
        timeout_s=30,  # before, it read /dev/zero for ever
    )
    await refused(out, "--file: /dev/zero is a device", pool)
    piped = _enqueue_from(db_url, workspace, Path("/dev/urandom"), *skip_bad)
    await refused(piped.proc, "--file: stdin is a device", pool)


async def test_an_empty_device_is_an_empty_file(db_url: str, workspace: UUID) -> None:
    out = cli("enqueue", "noop", "--workspace", str(workspace), "--file", "/dev/null", url=db_url)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "enqueued 0 jobs from /dev/null\n"


async def test_a_line_too_long_stops_the_command_without_reading_on(
    db_url: str, pool: asyncpg.Pool, workspace: UUID, tmp_path: Path
) -> None:
    fifo = tmp_path / "jobs.fifo"
    os.mkfifo(fifo)
    done = threading.Event()

    def write_and_hold() -> None:
        """One line past the limit, and more of it to come: the pipe is held open."""
        with fifo.open("wb") as pipe:
            pipe.write(b"x" * (MAX_LINE_BYTES + 2))
            pipe.flush()
            done.wait(120)

    writer = threading.Thread(target=write_and_hold)
    writer.start()
    try:
        out = await asyncio.to_thread(
            cli,
            *("enqueue", "noop", "--workspace", str(workspace), "--file", str(fifo)),
            url=db_url,
            timeout_s=30,  # before, it waited for the end of the line
        )
    finally:
        done.set()
        writer.join()
    await refused(out, f"line 1: longer than {MAX_LINE_BYTES} bytes", pool)


@pytest.mark.parametrize("bulk", [False, True])
async def test_a_unique_key_that_never_resolves_is_one_clear_error(
    db_url: str, pool: asyncpg.Pool, workspace: UUID, tmp_path: Path, bulk: bool
) -> None:
    # The key held at every insert and its holder finished by the look-up after it, each of
    # the client's rounds: the client's UniqueKeyUnresolved came out of `enqueue` as a
    # traceback (a RuntimeError).
    await contend_unique_key(pool, workspace, "contended")
    if bulk:
        path = tmp_path / "jobs.jsonl"
        path.write_text('{"payload": {}}\n{"unique_key": "contended"}\n', encoding="utf-8")
        flags: tuple[str, ...] = ("--file", str(path))
    else:
        flags = ("--unique-key", "contended")
    out = cli("enqueue", "noop", "--workspace", str(workspace), *flags, url=db_url)
    error = one_line_error(out)
    assert out.returncode == 2
    assert "unique key 'contended' is held" in error and "nothing was enqueued" in error, error
    assert await pool.fetchval("SELECT count(*) FROM job_queue WHERE status <> 'completed'") == 0
