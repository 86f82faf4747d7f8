"""Test databases: a real PostgreSQL (DATABASE_URL, else the embedded one); one migrated template
per session and a fresh copy of it per test (CREATE DATABASE ... TEMPLATE), so tests are
parallel-safe and never see each other's rows."""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import urlsplit
from uuid import UUID, uuid4

import asyncpg
import pytest

from sidelinja_worker.queue import migrate
from sidelinja_worker.queue.db import connect, init_connection
from sidelinja_worker.queue.embedded import start_embedded
from tests.helpers import SPAWNED


def with_database(url: str, name: str) -> str:
    return urlsplit(url)._replace(path=f"/{name}").geturl()


@pytest.fixture(autouse=True)
def _no_stray_processes() -> Iterator[None]:
    """A failed test must not leave workers running into the next one."""
    yield
    while SPAWNED:
        proc = SPAWNED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.fixture(scope="session")
def admin_url() -> str:
    url = os.environ.get("DATABASE_URL")
    if url:
        return url
    # One folder per user: another user's server there is not ours to join or start.
    folder = Path(tempfile.gettempdir()) / f"sidelinja-worker-tests-{os.getuid()}"
    return start_embedded(folder)


async def _create_template(admin_url: str, name: str) -> None:
    admin = await asyncpg.connect(admin_url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    conn = await connect(with_database(admin_url, name))
    try:
        await migrate.apply_all(conn)
    finally:
        await conn.close()


async def _drop(admin_url: str, name: str) -> None:
    admin = await asyncpg.connect(admin_url)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@pytest.fixture(scope="session")
def template_name(admin_url: str) -> Iterator[str]:
    name = f"sw_tmpl_{uuid4().hex[:12]}"
    asyncio.run(_create_template(admin_url, name))
    yield name
    asyncio.run(_drop(admin_url, name))


@pytest.fixture
async def db_url(admin_url: str, template_name: str) -> AsyncIterator[str]:
    """A fresh, migrated database for this test alone."""
    name = f"sw_test_{uuid4().hex[:12]}"
    admin = await asyncpg.connect(admin_url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_name}"')
    finally:
        await admin.close()
    yield with_database(admin_url, name)
    await _drop(admin_url, name)


@pytest.fixture
async def empty_db_url(admin_url: str) -> AsyncIterator[str]:
    """A fresh database with no schema at all."""
    name = f"sw_empty_{uuid4().hex[:12]}"
    admin = await asyncpg.connect(admin_url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    yield with_database(admin_url, name)
    await _drop(admin_url, name)


@pytest.fixture
async def pool(db_url: str) -> AsyncIterator[asyncpg.Pool]:
    # Its own application_name, so a test can kill the workers' connections and not its own.
    p = await asyncpg.create_pool(
        db_url,
        min_size=1,
        max_size=6,
        init=init_connection,
        server_settings={"application_name": "sidelinja-tests"},
    )
    yield p
    await p.close()


@pytest.fixture
async def workspace(pool: asyncpg.Pool) -> UUID:
    return await pool.fetchval("INSERT INTO workspaces (name) VALUES ('test') RETURNING id")
