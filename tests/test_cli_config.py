"""Hostile configuration (DATABASE_URL, NAME_FILE secrets) given to any command: a password
never prints, and a bad value is one clear line with exit code 2, never a traceback or a hang."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers import cli, one_line_error

SECRET = "Hemmelig"


@pytest.mark.parametrize(
    "url",
    [
        f" postgresql://u:{SECRET}@127.0.0.1:1/db",
        f"\npostgresql://u:{SECRET}@127.0.0.1:1/db",
        f"postgresql:/u:{SECRET}@127.0.0.1:1/db",
    ],
)
def test_a_database_url_of_an_odd_shape_never_prints_its_password(url: str) -> None:
    out = cli("workspace", "list", url=url, timeout_s=60)
    assert out.returncode != 0
    assert SECRET not in out.stderr + out.stdout, out.stderr


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("postgresql://u@127.0.0.1:99999/db", "cannot connect to the database"),
        ("postgresql://u@[::1/db", "cannot connect to the database"),
    ],
)
def test_a_database_url_asyncpg_cannot_read_is_one_clear_error(url: str, says: str) -> None:
    out = cli("jobs", "list", url=url, timeout_s=60)
    assert says in one_line_error(out)
    assert out.returncode == 2


def test_a_secret_file_that_is_not_one_is_one_clear_error(db_url: str, tmp_path: Path) -> None:
    """Every command loads every secret: a bad file of one a command never uses still stops
    it, with one line naming the variable, never with a traceback or a hang."""
    not_utf8 = tmp_path / "not-utf8"
    not_utf8.write_bytes(b"tok\xff\n")
    big = tmp_path / "big"
    big.write_bytes(b"x" * 1024 * 1024)  # no secret is a megabyte
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for variable, path, says in [
        ("FORGEJO_TOKEN_FILE", not_utf8, "is not UTF-8 text"),
        ("WHISPER_API_KEY_FILE", fifo, "is not a regular file"),
        ("WHISPER_API_KEY_FILE", tmp_path, "is not a regular file"),
        ("AI_GATEWAY_KEY_FILE", big, "is larger than"),
    ]:
        out = cli("jobs", "list", url=db_url, env={variable: str(path)}, timeout_s=20)
        error = one_line_error(out)
        assert error.startswith(f"sidelinja-worker: error: {variable}: ") and says in error
        assert out.returncode == 2


async def test_prune_refuses_an_uppercase_m(db_url: str) -> None:
    out = cli("prune", "--dry-run", "--keep-completed", "1M", url=db_url)
    assert "minutes or months" in one_line_error(out)
    assert out.returncode == 2
