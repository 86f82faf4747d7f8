"""The migrations give the seed's schema exactly, and are safe to run twice at once."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from sidelinja_worker.queue import migrate
from tests.helpers import cli

SEED_COLUMNS = {
    # column: (type, nullable, default)
    "id": ("uuid", "NO", "gen_random_uuid()"),
    "workspace_id": ("uuid", "NO", None),
    "job_type": ("text", "NO", None),
    "payload": ("jsonb", "NO", None),
    "status": ("job_status", "NO", "'pending'::job_status"),
    "priority": ("smallint", "NO", "0"),
    "result": ("jsonb", "YES", None),
    "error_msg": ("text", "YES", None),
    "attempts": ("smallint", "NO", "0"),
    "max_attempts": ("smallint", "NO", "3"),
    "created_at": ("timestamp with time zone", "NO", "now()"),
    "started_at": ("timestamp with time zone", "YES", None),
    "completed_at": ("timestamp with time zone", "YES", None),
    "scheduled_for": ("timestamp with time zone", "NO", "now()"),
}


async def test_job_queue_has_every_seed_column_exactly(pool: asyncpg.Pool) -> None:
    rows = await pool.fetch(
        "SELECT column_name, CASE WHEN data_type = 'USER-DEFINED' THEN udt_name ELSE data_type END,"
        " is_nullable, column_default FROM information_schema.columns"
        " WHERE table_name = 'job_queue'"
    )
    found = {r[0]: (r[1], r[2], r[3]) for r in rows}
    for column, expected in SEED_COLUMNS.items():
        assert found[column] == expected, column
    enum = await pool.fetchval("SELECT enum_range(NULL::job_status)::text[]")
    assert enum[:5] == ["pending", "running", "completed", "error", "retry"]
    index = await pool.fetchval(
        "SELECT indexdef FROM pg_indexes WHERE indexname = 'idx_job_queue_pending'"
    )
    assert index.endswith(
        "(priority DESC, scheduled_for) WHERE (status = ANY "
        "(ARRAY['pending'::job_status, 'retry'::job_status]))"
    )
    fk = await pool.fetchval(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = 'job_queue'::regclass"
        " AND contype = 'f'"
    )
    assert fk == "FOREIGN KEY (workspace_id) REFERENCES workspaces(id) ON DELETE CASCADE"
    settings = await pool.fetchval(
        "SELECT data_type FROM information_schema.columns"
        " WHERE table_name = 'workspaces' AND column_name = 'settings'"
    )
    assert settings == "jsonb"


async def test_migrate_twice_at_once_applies_each_migration_once(empty_db_url: str) -> None:
    procs = await asyncio.gather(
        *(asyncio.to_thread(cli, "migrate", url=empty_db_url) for _ in range(3))
    )
    assert [p.returncode for p in procs] == [0, 0, 0], [p.stderr for p in procs]
    applied = [line for p in procs for line in p.stdout.splitlines() if line.startswith("applied")]
    shipped = migrate.shipped_migrations()
    assert len(applied) == len(shipped)  # every migration applied by exactly one process
    conn = await asyncpg.connect(empty_db_url)
    try:
        assert await conn.fetchval("SELECT count(*) FROM sidelinja_schema_migrations") == len(
            shipped
        )
    finally:
        await conn.close()


async def test_migrate_check_exits_nonzero_while_pending(empty_db_url: str) -> None:
    before = cli("migrate", "--check", url=empty_db_url)
    assert before.returncode == 1 and "pending: 0001_job_queue" in before.stdout
    assert cli("migrate", url=empty_db_url).returncode == 0
    after = cli("migrate", "--check", url=empty_db_url)
    assert after.returncode == 0, after.stdout


async def test_migration_keeps_an_existing_platform_table(empty_db_url: str) -> None:
    """On the real platform workspaces (and perhaps job_queue) exist already: adopt them."""
    conn = await asyncpg.connect(empty_db_url)
    try:
        await conn.execute(
            "CREATE TABLE workspaces (id UUID PRIMARY KEY DEFAULT gen_random_uuid(),"
            " name TEXT NOT NULL, settings JSONB NOT NULL DEFAULT '{}', slug TEXT)"
        )
        await conn.execute("INSERT INTO workspaces (name, slug) VALUES ('ekte', 'ekte')")
    finally:
        await conn.close()
    assert cli("migrate", url=empty_db_url).returncode == 0
    conn = await asyncpg.connect(empty_db_url)
    try:
        assert await conn.fetchval("SELECT slug FROM workspaces") == "ekte"
    finally:
        await conn.close()


async def test_the_unique_key_migration_resolves_duplicates_the_old_index_let_in(
    pool: asyncpg.Pool,
) -> None:
    """Before 0032 a waiting job's key was outside the index, so queued duplicates may exist
    where it runs: the one not waiting, else the oldest, keeps the key; every other one (always
    waiting) is cancelled naming it, and the index is built."""
    await pool.execute(
        "DROP INDEX idx_job_queue_unique_key;"
        " CREATE UNIQUE INDEX idx_job_queue_unique_key ON job_queue (workspace_id, unique_key)"
        " WHERE unique_key IS NOT NULL AND status IN ('pending', 'retry', 'running')"
    )
    workspace = await pool.fetchval("INSERT INTO workspaces (name) VALUES ('w') RETURNING id")
    ids = {
        name: await pool.fetchval(
            "INSERT INTO job_queue (workspace_id, job_type, payload, unique_key, created_at,"
            " status) VALUES ($1, 'noop', '{}', $2, now() - make_interval(secs => $3), $4)"
            " RETURNING id",
            workspace,
            key,
            age_s,
            status,
        )
        for name, key, age_s, status in (
            ("parent", None, 10, "pending"),
            ("waiting_a", "a", 3, "waiting"),
            ("waiting_b_old", "b", 2, "waiting"),
            ("waiting_b_new", "b", 1, "waiting"),
        )
    }
    await pool.execute(
        "INSERT INTO job_dependencies (parent_id, child_id) SELECT $1, unnest($2::uuid[])",
        ids["parent"],
        [ids["waiting_a"], ids["waiting_b_old"], ids["waiting_b_new"]],
    )
    ids["pending_a"] = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload, unique_key)"
        " VALUES ($1, 'noop', '{}', 'a') RETURNING id",
        workspace,
    )
    (migration,) = [m for m in migrate.shipped_migrations() if m.version == 32]
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(migration.sql)
    rows = {
        r["id"]: (r["st"], r["error_msg"])
        for r in await pool.fetch("SELECT id, status::text AS st, error_msg FROM job_queue")
    }
    assert rows == {
        ids["parent"]: ("pending", None),
        ids["pending_a"]: ("pending", None),
        ids["waiting_a"]: ("cancelled", f"its unique key is held by job {ids['pending_a']}"),
        ids["waiting_b_old"]: ("waiting", None),
        ids["waiting_b_new"]: (
            "cancelled",
            f"its unique key is held by job {ids['waiting_b_old']}",
        ),
    }
    with pytest.raises(asyncpg.UniqueViolationError):
        await pool.execute(
            "INSERT INTO job_queue (workspace_id, job_type, payload, unique_key)"
            " VALUES ($1, 'noop', '{}', 'b')",
            workspace,
        )
