"""Row-level security on job_queue, tested in SQL as the application role entered with SET LOCAL
ROLE, as the admin view does (tests/test_rls.py tests login roles set up as the README says)."""

from __future__ import annotations

from uuid import UUID, uuid4

import asyncpg
import pytest

from tests.helpers import insert_jobs, make_workspace


async def two_workspaces(pool: asyncpg.Pool) -> tuple[UUID, UUID]:
    a = await make_workspace(pool, "A")
    b = await make_workspace(pool, "B")
    await insert_jobs(pool, a, 3)
    await insert_jobs(pool, b, 2)
    return a, b


async def as_app(conn: asyncpg.Connection, workspace: UUID | None, all_: bool = False) -> None:
    """The app role for one workspace; all_: the platform admin role instead."""
    await conn.execute(
        "SELECT set_config('sidelinja.workspace_id', $1, true)", str(workspace or "")
    )
    await conn.execute(f"SET LOCAL ROLE {'sidelinja_platform_admin' if all_ else 'sidelinja_app'}")


async def test_a_workspace_sees_and_changes_only_its_own_rows(pool: asyncpg.Pool) -> None:
    a, b = await two_workspaces(pool)
    async with pool.acquire() as conn, conn.transaction():
        await as_app(conn, a)
        seen = await conn.fetch("SELECT DISTINCT workspace_id FROM job_queue")
        assert [r[0] for r in seen] == [a]
        assert await conn.fetchval("SELECT count(*) FROM job_queue") == 3
        assert (
            await conn.execute("UPDATE job_queue SET priority = 9 WHERE workspace_id = $1", b)
            == "UPDATE 0"
        )
    assert await pool.fetchval("SELECT count(*) FROM job_queue WHERE priority = 9") == 0


async def test_no_delete_and_no_insert_into_another_workspace(pool: asyncpg.Pool) -> None:
    a, b = await two_workspaces(pool)
    async with pool.acquire() as conn:
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            async with conn.transaction():
                await as_app(conn, a)
                await conn.execute(
                    "INSERT INTO job_queue (workspace_id, job_type, payload)"
                    " VALUES ($1, 'noop', '{}')",
                    b,
                )
        async with conn.transaction():  # its own workspace: allowed, as the web app enqueues
            await as_app(conn, a)
            await conn.execute(
                "INSERT INTO job_queue (workspace_id, job_type, payload) VALUES ($1, 'noop', '{}')",
                a,
            )
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            async with conn.transaction():  # moving a job into B is refused by WITH CHECK
                await as_app(conn, a)
                await conn.execute("UPDATE job_queue SET workspace_id = $1", b)
    assert await pool.fetchval("SELECT count(*) FROM job_queue WHERE workspace_id = $1", b) == 2


async def test_unset_setting_sees_nothing_and_the_platform_role_sees_all(
    pool: asyncpg.Pool,
) -> None:
    await two_workspaces(pool)
    async with pool.acquire() as conn:
        async with conn.transaction():
            await as_app(conn, None)
            assert await conn.fetchval("SELECT count(*) FROM job_queue") == 0
        async with conn.transaction():  # the setting that once meant "every workspace"
            await as_app(conn, None)
            await conn.execute("SELECT set_config('sidelinja.all_workspaces', 'on', true)")
            assert await conn.fetchval("SELECT count(*) FROM job_queue") == 0
        async with conn.transaction():
            await as_app(conn, None, all_=True)
            assert await conn.fetchval("SELECT count(*) FROM job_queue") == 5
        # SET LOCAL and set_config(..., true) end with the transaction: nothing leaks to the
        # next user of a pooled connection.
        assert await conn.fetchval("SELECT current_user") != "sidelinja_app"
        assert await conn.fetchval("SELECT current_setting('sidelinja.workspace_id', true)") in (
            "",
            None,
        )


async def test_the_worker_role_still_sees_everything(pool: asyncpg.Pool) -> None:
    await two_workspaces(pool)
    assert await pool.fetchval("SELECT count(*) FROM job_queue") == 5


async def test_the_app_role_cannot_read_tokens_or_write_the_audit(pool: asyncpg.Pool) -> None:
    a, _b = await two_workspaces(pool)
    async with pool.acquire() as conn:
        for sql in ("SELECT * FROM admin_tokens", "INSERT INTO admin_audit (action) VALUES ('x')"):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                async with conn.transaction():
                    await as_app(conn, a)
                    await conn.execute(sql)


async def test_a_noinherit_web_role_sees_nothing_until_it_takes_the_app_role(
    pool: asyncpg.Pool,
) -> None:
    """A NOINHERIT member (as the README once advised) with rights of its own on the table: no
    policy applies to it, so it reads nothing; after SET LOCAL ROLE sidelinja_app, only the
    workspace in the setting."""
    a, _b = await two_workspaces(pool)
    role = f"sidelinja_test_web_{uuid4().hex[:12]}"  # roles are cluster-wide
    try:
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute(f"CREATE ROLE {role} NOLOGIN NOINHERIT")
            await conn.execute(f"GRANT SELECT ON job_queue TO {role}")
            await conn.execute(f"GRANT sidelinja_app TO {role}")
            await conn.execute(f"SET LOCAL ROLE {role}")
            assert await conn.fetchval("SELECT count(*) FROM job_queue") == 0
            await as_app(conn, a)
            assert await conn.fetchval("SELECT count(*) FROM job_queue") == 3
    finally:
        await pool.execute(f"DROP OWNED BY {role}")
        await pool.execute(f"DROP ROLE {role}")
