"""Test databases: a real PostgreSQL (DATABASE_URL, else the embedded one); one migrated template
per session and a fresh copy of it per test (CREATE DATABASE ... TEMPLATE), so tests are
parallel-safe and never see each other's rows."""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from uuid import UUID, uuid4

import asyncpg
import pytest

from sidelinja_worker.queue.db import init_connection
from sidelinja_worker.queue.embedded import start_embedded
from tests.helpers import (
    SPAWNED,
    create_database,
    create_template,
    drop_database,
    make_workspace,
    with_database,  # noqa: F401  (tests import it from here too)
)


@pytest.fixture(autouse=True)
def _no_stray_processes() -> Iterator[None]:
    """A failed test must not leave workers running into the next one, nor their output files
    open."""
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


@pytest.fixture(scope="session")
def template_name(admin_url: str) -> Iterator[str]:
    name = f"sw_tmpl_{uuid4().hex[:12]}"
    asyncio.run(create_template(admin_url, name))
    yield name
    asyncio.run(drop_database(admin_url, name))


@pytest.fixture
async def db_url(admin_url: str, template_name: str) -> AsyncIterator[str]:
    """A fresh, migrated database for this test alone."""
    name = f"sw_test_{uuid4().hex[:12]}"
    yield await create_database(admin_url, name, template_name)
    await drop_database(admin_url, name)


@pytest.fixture
async def empty_db_url(admin_url: str) -> AsyncIterator[str]:
    """A fresh database with no schema at all."""
    name = f"sw_empty_{uuid4().hex[:12]}"
    yield await create_database(admin_url, name)
    await drop_database(admin_url, name)


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
    return await make_workspace(pool)
