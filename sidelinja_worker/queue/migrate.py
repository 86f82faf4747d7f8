"""Applies and records the numbered schema migrations shipped in sql/migrations/."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources

import asyncpg

from sidelinja_worker.queue.errors import UserError

# Any 64-bit number unique to us; two `migrate` runs at once serialise on it.
LOCK_KEY = 0x5349_444C_494E_4A41  # "SIDLINJA"
_FILE = re.compile(r"^(\d{4})_(\w+)\.sql$")
_TABLE = "sidelinja_schema_migrations"


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def shipped_migrations() -> list[Migration]:
    folder = resources.files("sidelinja_worker.queue").joinpath("sql/migrations")
    found = []
    for entry in folder.iterdir():
        match = _FILE.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text("utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise RuntimeError(f"two migrations share a number: {versions}")
    return found


async def applied_versions(conn: asyncpg.Connection) -> set[int]:
    exists = await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", _TABLE)
    if not exists:
        return set()
    return {r[0] for r in await conn.fetch(f"SELECT version FROM {_TABLE}")}


async def pending(conn: asyncpg.Connection) -> list[Migration]:
    done = await applied_versions(conn)
    return [m for m in shipped_migrations() if m.version not in done]


def require_utf8(conn: asyncpg.Connection) -> None:
    """Raises a UserError unless the database's encoding is UTF8. Jobs carry text in any
    language (a transcript, a name in Sámi, an emoji in a title): in LATIN1 such a result could
    not be stored and its job ended in `error` (the migrations themselves failed on a `…`),
    and SQL_ASCII stores whatever bytes a writer sends, unchecked, so a row could hold text
    that no UTF-8 reader can decode. The server reports its encoding when the session starts,
    so this asks nothing of it."""
    encoding = conn.get_settings().server_encoding
    if encoding != "UTF8":
        raise UserError(
            f"the database's encoding is {encoding}; sidelinja-worker needs UTF8 (create it"
            " with CREATE DATABASE … ENCODING 'UTF8' TEMPLATE template0)"
        )


# (position from 1, how many this run applies, the migration): called as each one starts.
OnStart = Callable[[int, int, Migration], None]


async def apply_all(
    conn: asyncpg.Connection,
    *,
    on_start: OnStart | None = None,
    on_wait: Callable[[], None] | None = None,
) -> list[Migration]:
    """Applies what is pending, each migration in its own transaction, under an advisory lock so
    that concurrent runs apply each migration once. Returns what this call applied. `on_wait` is
    called once if another run holds the lock, `on_start` as each migration starts. Refuses a
    database whose encoding is not UTF8 (require_utf8)."""
    require_utf8(conn)
    if not await conn.fetchval("SELECT pg_try_advisory_lock($1)", LOCK_KEY):
        if on_wait is not None:
            on_wait()
        await conn.execute("SELECT pg_advisory_lock($1)", LOCK_KEY)
    try:
        await conn.execute(
            f"CREATE TABLE IF NOT EXISTS {_TABLE} ("
            " version INTEGER PRIMARY KEY, name TEXT NOT NULL,"
            " applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
        )
        applied = []
        todo = await pending(conn)
        for position, migration in enumerate(todo, start=1):
            if on_start is not None:
                on_start(position, len(todo), migration)
            async with conn.transaction():
                await conn.execute(migration.sql)
                await conn.execute(
                    f"INSERT INTO {_TABLE} (version, name) VALUES ($1, $2)",
                    migration.version,
                    migration.name,
                )
            applied.append(migration)
        return applied
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", LOCK_KEY)


async def require_migrated(conn: asyncpg.Connection) -> None:
    """Raises a UserError naming the first pending migration, if any, or the database's
    encoding if it is not UTF8 (require_utf8)."""
    require_utf8(conn)
    missing = await pending(conn)
    if missing:
        first = missing[0]
        raise UserError(
            f"the database is not migrated ({len(missing)} pending, first "
            f"{first.version:04d}_{first.name}): run `sidelinja-worker migrate`"
        )
