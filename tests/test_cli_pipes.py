"""Output into a pipe the reader has closed (`| head`): the command stops quietly, as the
shell's own tools do, and blames nothing."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PIPE_CLOSED = 141  # 128 + SIGPIPE, what a shell reports for a tool its pipe stopped


@pytest.mark.parametrize("command", [("jobs", "list", "--status", "all"), ("limits",)])
def test_a_closed_pipe_ends_the_command_without_blaming_the_database(
    db_url: str, command: tuple[str, ...]
) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first line: every write fails
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "sidelinja_worker", *command],
            env={**os.environ, "DATABASE_URL": db_url},
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write_end)
    said = [ln for ln in proc.stderr.splitlines() if not ln.startswith("sidelinja-worker: using")]
    assert said == []
    assert proc.returncode == PIPE_CLOSED
