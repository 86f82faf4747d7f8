"""Hostile configuration (DATABASE_URL, NAME_FILE secrets) given to any command: a password
never prints, and a bad value is one clear line with exit code 2, never a traceback or a hang."""

from __future__ import annotations

import pytest

from tests.helpers import cli

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
