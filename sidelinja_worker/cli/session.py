"""What every command starts with: the database it names, opened and checked, and its ids parsed."""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any
from uuid import UUID

import asyncpg

from sidelinja_worker.queue import migrate
from sidelinja_worker.queue.db import (
    DB_ERRORS,
    Database,
    connect,
    create_pool,
    resolve_database,
    say,
)
from sidelinja_worker.queue.errors import UserError

START_ATTEMPTS = 4  # a connection lost while starting is tried again, ~0.7 s in all


@asynccontextmanager
async def opened(
    args: argparse.Namespace,
    *,
    pool_size: int = 2,
    must_be_migrated: bool = True,
    settings: Mapping[str, str] | None = None,
) -> AsyncIterator[tuple[Database, asyncpg.Pool]]:
    """The database named by the settings, announced in one line, migrated if embedded; its
    pool's sessions with the server `settings`."""
    db = resolve_database(args.settings.database, args.settings.data_dir)
    say(f"sidelinja-worker: {db.describe()}")
    for attempt in range(START_ATTEMPTS):
        conn = await connect(db.url, timeout=10)  # unreachable: a UserError, at once
        try:
            if db.embedded:
                await migrate.apply_all(conn)
            elif must_be_migrated:
                await migrate.require_migrated(conn)
            break
        except DB_ERRORS:  # the connection was lost during the check: connect again
            if attempt == START_ATTEMPTS - 1:
                raise
            await asyncio.sleep(0.1 * 2**attempt)
        finally:
            try:
                await conn.close()
            except DB_ERRORS:
                conn.terminate()
    pool = await create_pool(db.url, max_size=pool_size, settings=settings)
    try:
        yield db, pool
    finally:
        try:
            await pool.close()
        except DB_ERRORS:  # the server dropped a connection at the very end: the work is done
            pool.terminate()


def parse_uuid(text: str, what: str) -> UUID:
    try:
        return UUID(text)
    except ValueError:
        raise UserError(f"{what} {text!r} is not a UUID") from None


def json_default(value: Any) -> str:
    """What json.dumps cannot write itself, as `jobs show` and `jobs list --json` print it:
    times in ISO 8601, ids and the rest as text."""
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


def why_not_listening(exc: OSError) -> str:
    """Why a server could not listen, in the errno's words ("Address already in use"): asyncio's
    own text repeats the address the flag already names."""
    reason = os.strerror(exc.errno) if exc.errno and exc.errno > 0 else exc.strerror
    return reason or str(exc)
