"""A database whose encoding is not UTF8 is refused by every command, with one line that says
what to do, before it can take a job."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import asyncpg
import pytest

from sidelinja_worker.queue import migrate
from tests.helpers import cli, drop_database, with_database

MakeDatabase = Callable[[str], Awaitable[str]]


@pytest.fixture
async def database_in(admin_url: str) -> AsyncIterator[MakeDatabase]:
    """Makes databases in a given encoding (from template0, locale C); drops them after."""
    made: list[str] = []

    async def make(encoding: str) -> str:
        name = f"sw_enc_{uuid.uuid4().hex[:12]}"
        admin = await asyncpg.connect(admin_url)
        try:
            await admin.execute(
                f"CREATE DATABASE {name} ENCODING '{encoding}' TEMPLATE template0"
                " LC_COLLATE 'C' LC_CTYPE 'C'"
            )
        finally:
            await admin.close()
        made.append(name)
        return with_database(admin_url, name)

    yield make
    for name in made:
        await drop_database(admin_url, name)


async def test_migrate_refuses_a_latin1_database_in_one_line(database_in: MakeDatabase) -> None:
    """Before, the migrations failed halfway with a traceback (a `…` in a comment of theirs
    has no LATIN1 character); a result in Sámi or with an emoji could not have been stored."""
    url = await database_in("LATIN1")
    done = await asyncio.to_thread(cli, "migrate", url=url)
    assert done.returncode == 2, done.stderr
    assert "encoding is LATIN1; sidelinja-worker needs UTF8" in done.stderr
    assert "Traceback" not in done.stderr


async def test_a_sql_ascii_database_is_refused_before_a_row_of_bytes_can_stop_every_worker(
    database_in: MakeDatabase,
) -> None:
    """SQL_ASCII stores the bytes a writer sends unchecked. A database migrated before the check
    (its migrations applied as they were then) holds a job whose payload is not UTF-8: every
    worker's first claim died on it (CharacterNotInRepertoireError, exit 3), so no job of the
    queue ran again. Now `run` and `migrate` refuse the database itself."""
    url = await database_in("SQL_ASCII")
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            "CREATE TABLE sidelinja_schema_migrations (version INTEGER PRIMARY KEY,"
            " name TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
        )
        for m in migrate.shipped_migrations():
            await conn.execute(m.sql)
            await conn.execute(
                "INSERT INTO sidelinja_schema_migrations (version, name) VALUES ($1, $2)",
                m.version,
                m.name,
            )
        workspace = await conn.fetchval("INSERT INTO workspaces (name) VALUES ('w') RETURNING id")
        await conn.execute(
            "INSERT INTO job_queue (workspace_id, job_type, payload)"
            " VALUES ($1, 'noop', E'{\"a\": \"\\xff\\xfe\"}'::jsonb), ($1, 'noop', '{}')",
            workspace,
        )
    finally:
        await conn.close()
    for args in (["run", "--burst"], ["migrate"]):
        done = await asyncio.to_thread(cli, *args, url=url)
        assert done.returncode == 2, done.stderr
        assert "encoding is SQL_ASCII; sidelinja-worker needs UTF8" in done.stderr, done.stderr
