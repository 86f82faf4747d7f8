"""No process left behind: every command that starts the embedded PostgreSQL stops it again on
SIGTERM as well as on a normal exit, and a dead process's record is cleaned at start (else no
later command would ever stop the server)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import pytest

from tests.helpers import SPAWNED, Spawned, wait_for


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One embedded data folder for the module: initdb runs once."""
    return tmp_path_factory.mktemp("embedded")


def _start(data_dir: Path, *args: str) -> Spawned:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env["SIDELINJA_DATA_DIR"] = str(data_dir)
    proc = Spawned([sys.executable, "-m", "sidelinja_worker", *args], env)
    SPAWNED.append(proc)
    return proc


def _server_pid(data_dir: Path) -> int | None:
    pidfile = data_dir / "pg" / "postmaster.pid"
    try:
        return int(pidfile.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _handles(data_dir: Path) -> list[int] | None:
    """The processes recorded as the server's users; None while the file is being rewritten
    (it is written in place, so a read can see it empty or cut short)."""
    path = data_dir / "pg" / ".handle_pids.json"
    try:
        return json.loads(path.read_text()) if path.exists() else []
    except ValueError:
        return None


async def _stopped_by_sigterm(data_dir: Path, started: str, *args: str) -> None:
    proc = _start(data_dir, *args)
    # Up: the server runs and the command has recorded itself as one of its users.
    await wait_for(
        lambda: proc.proc.pid in (_handles(data_dir) or []) or proc.poll() is not None, 120
    )
    await wait_for(lambda: _server_pid(data_dir) is not None or proc.poll() is not None, 60)
    assert proc.poll() is None, proc.communicate()
    server = _server_pid(data_dir)
    assert server is not None and _alive(server)
    # Into the command's main loop, past start-up: the line it logs as it gets there.
    await wait_for(lambda: started in proc.stderr_so_far() or proc.poll() is not None, 60)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGTERM)
    _out, err = await asyncio.to_thread(proc.communicate, 30)
    assert proc.returncode in (0, 128 + signal.SIGTERM), err
    await wait_for(lambda: not _alive(server), 15)
    assert _handles(data_dir) == []


async def test_admin_stopped_by_sigterm_stops_the_embedded_server(data_dir: Path) -> None:
    await _stopped_by_sigterm(data_dir, "admin: http://", "admin", "--bind", "127.0.0.1:0")


async def test_run_stopped_by_sigterm_stops_the_embedded_server(data_dir: Path) -> None:
    await _stopped_by_sigterm(data_dir, " started: types ", "run", "--grace", "1s")


async def test_a_dead_processs_record_is_cleaned_at_start(data_dir: Path) -> None:
    dead = 2**22 + 12345  # above Linux's largest pid_max: no process has it
    handles = data_dir / "pg" / ".handle_pids.json"
    handles.parent.mkdir(parents=True, exist_ok=True)
    handles.write_text(json.dumps([dead]))
    proc = _start(data_dir, "migrate")
    _out, err = await asyncio.to_thread(proc.communicate, 120)
    assert proc.returncode == 0, err
    server = _server_pid(data_dir)
    await wait_for(lambda: server is None or not _alive(server), 15)
    assert _handles(data_dir) == []
