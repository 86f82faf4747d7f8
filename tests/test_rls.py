"""Row-level security fails closed, tested with real login roles connecting on their own, set up
exactly as the README says (`GRANT sidelinja_app TO web`, then `set_config(
'sidelinja.workspace_id', ...)` per transaction). Roles are cluster-wide, so each test makes
its own with a unique name and drops it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from urllib.parse import urlsplit
from uuid import UUID, uuid4

import asyncpg
import pytest

from sidelinja_worker.queue import client
from sidelinja_worker.queue.client import NewJob
from sidelinja_worker.queue.db import init_connection
from tests.helpers import insert_jobs

RoleMaker = Callable[..., Awaitable[str]]


def as_user(url: str, user: str) -> str:
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=f"{user}@{host}").geturl()


@pytest.fixture(name="make_role")
async def make_role_fixture(pool: asyncpg.Pool) -> AsyncIterator[RoleMaker]:
    """make_role(*grants) -> a new LOGIN role's name; `grants` are SQL run with {r} as the role.
    Dropped afterwards (its privileges in this database first, then the role)."""
    made: list[str] = []

    async def make(*grants: str, login: bool = True) -> str:
        name = f"sw_test_role_{uuid4().hex[:12]}"
        await pool.execute(f"CREATE ROLE {name} {'LOGIN' if login else 'NOLOGIN'}")
        made.append(name)
        for sql in grants:
            await pool.execute(sql.format(r=name))
        return name

    yield make
    for name in made:
        await pool.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", name
        )
        await pool.execute(f"DROP OWNED BY {name}")
        await pool.execute(f"DROP ROLE {name}")


@asynccontextmanager
async def connected(db_url: str, role: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(as_user(db_url, role))
    await init_connection(conn)
    try:
        yield conn
    finally:
        await conn.close()


async def two_workspaces(pool: asyncpg.Pool) -> tuple[UUID, UUID]:
    a = await pool.fetchval(
        "INSERT INTO workspaces (name, settings) VALUES ('A', '{\"key\": \"A-secret\"}')"
        " RETURNING id"
    )
    b = await pool.fetchval(
        "INSERT INTO workspaces (name, settings) VALUES ('B', '{\"key\": \"B-secret\"}')"
        " RETURNING id"
    )
    await insert_jobs(pool, a, 3)
    await insert_jobs(pool, b, 2)
    return a, b


async def in_workspace(conn: asyncpg.Connection, workspace: UUID | str) -> None:
    await conn.execute("SELECT set_config('sidelinja.workspace_id', $1, true)", str(workspace))


WEB = "GRANT sidelinja_app TO {r}"  # the README's setup, word for word
# A web role that already had full rights on the queue before row-level security came.
OLD_GRANTS = "GRANT SELECT, INSERT, UPDATE, DELETE ON job_queue, workspaces TO {r}"


async def test_a_web_role_sees_and_changes_no_job_until_it_sets_its_workspace(
    pool: asyncpg.Pool, db_url: str, make_role: RoleMaker
) -> None:
    a, b = await two_workspaces(pool)
    web = await make_role(WEB, OLD_GRANTS)
    async with connected(db_url, web) as conn:
        assert await conn.fetchval("SELECT count(*) FROM job_queue") == 0
        assert await conn.execute("UPDATE job_queue SET priority = 9") == "UPDATE 0"
        assert await conn.execute("DELETE FROM job_queue") == "DELETE 0"
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute(
                "INSERT INTO job_queue (workspace_id, job_type, payload) VALUES ($1, 'noop', '{}')",
                a,
            )
        async with conn.transaction():
            await in_workspace(conn, a)
            assert await conn.fetchval("SELECT count(*) FROM job_queue") == 3
            assert await conn.execute("UPDATE job_queue SET priority = 9") == "UPDATE 3"
        # The setting ends with its transaction: the next one is closed again.
        assert await conn.fetchval("SELECT count(*) FROM job_queue") == 0
    assert await pool.fetchval("SELECT count(*) FROM job_queue WHERE priority = 9") == 3
    assert await pool.fetchval("SELECT count(*) FROM job_queue WHERE workspace_id = $1", b) == 2


async def test_a_web_role_cannot_give_itself_every_workspace(
    pool: asyncpg.Pool, db_url: str, make_role: RoleMaker
) -> None:
    await two_workspaces(pool)
    web = await make_role(WEB, OLD_GRANTS)
    async with connected(db_url, web) as conn:
        for name, value in (
            ("sidelinja.all_workspaces", "on"),  # what the README once offered
            ("sidelinja.workspace_id", ""),
            ("sidelinja.workspace_id", "*"),
        ):
            async with conn.transaction():
                try:
                    await conn.execute("SELECT set_config($1, $2, true)", name, value)
                    seen = await conn.fetchval("SELECT count(*) FROM job_queue")
                except asyncpg.InvalidTextRepresentationError:
                    seen = 0  # '*' is no uuid: the query fails, which shows nothing either
                assert seen == 0, (name, value)
        for sql in (
            "SET ROLE sidelinja_platform_admin",
            f"GRANT sidelinja_platform_admin TO {web}",
            "ALTER TABLE job_queue DISABLE ROW LEVEL SECURITY",
            "DROP POLICY job_queue_workspace ON job_queue",
        ):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.execute(sql)


async def test_the_platform_admin_is_a_separate_role_that_sees_every_workspace(
    pool: asyncpg.Pool, db_url: str, make_role: RoleMaker
) -> None:
    await two_workspaces(pool)
    admin = await make_role("GRANT sidelinja_platform_admin TO {r}")
    async with connected(db_url, admin) as conn:
        assert await conn.fetchval("SELECT count(*) FROM job_queue") == 5
        assert await conn.fetchval("SELECT count(*) FROM workspaces") == 2


async def test_any_other_non_owner_role_sees_nothing(
    pool: asyncpg.Pool, db_url: str, make_role: RoleMaker
) -> None:
    """No policy applies to a role outside sidelinja_app and sidelinja_platform_admin, so even
    a role granted every right on the tables reads no row (a NOINHERIT member, as the README
    once advised, included)."""
    await two_workspaces(pool)
    other = await make_role(OLD_GRANTS)
    noinherit = await make_role(WEB, OLD_GRANTS, "ALTER ROLE {r} NOINHERIT")
    for role in (other, noinherit):
        async with connected(db_url, role) as conn:
            assert await conn.fetchval("SELECT count(*) FROM job_queue") == 0
            assert await conn.fetchval("SELECT count(*) FROM workspaces") == 0


async def test_other_workspaces_settings_are_not_readable(
    pool: asyncpg.Pool, db_url: str, make_role: RoleMaker
) -> None:
    a, _b = await two_workspaces(pool)
    web = await make_role(WEB)
    async with connected(db_url, web) as conn:
        assert await conn.fetch("SELECT settings FROM workspaces") == []
        async with conn.transaction():
            await in_workspace(conn, a)
            rows = await conn.fetch("SELECT id, settings FROM workspaces")
        assert [(r["id"], r["settings"]) for r in rows] == [(a, {"key": "A-secret"})]
        with pytest.raises(asyncpg.InsufficientPrivilegeError):  # and none are writable
            async with conn.transaction():
                await in_workspace(conn, a)
                await conn.execute("UPDATE workspaces SET settings = '{}'")


# Rows of A and of B in the workspace-owned tables the web app reads.
OWNED_ROWS = [
    "INSERT INTO transcripts (workspace_id, transcript_ref, source, plain_text, webvtt,"
    " segment_count, duration_ms) VALUES ($1, 'ep1', '{}', 't', 'WEBVTT', 1, 1000)",
    "INSERT INTO transcript_segments (workspace_id, transcript_ref, seq, start_ms, end_ms, text)"
    " VALUES ($1, 'ep1', 1, 0, 1000, 'hei')",
    "INSERT INTO ai_results (workspace_id, kind, source_ref, model, result)"
    " VALUES ($1, 'meeting_summarize', 'ep1', 'm', '{}')",
    "INSERT INTO podcast_downloads_daily (workspace_id, day, episode, downloads)"
    " VALUES ($1, current_date, 'ep1', 5)",
    "INSERT INTO knowledge_nodes (workspace_id, node_id, content) VALUES ($1, 'n1', 'x')",
    "INSERT INTO valgomat_questions (workspace_id, quiz_id, question_id, text)"
    " VALUES ($1, 'q', 'q1', 'Skal ...?')",
    "INSERT INTO valgomat_profiles (workspace_id, quiz_id, party, model, profile)"
    " VALUES ($1, 'q', 'p', 'm', '{}')",
    "INSERT INTO valgomat_moderation (workspace_id, quiz_id, submission_ref, question, rewrite,"
    " result, model) VALUES ($1, 'q', 's1', 'x', 'x', '{}', 'm')",
    "WITH r AS (INSERT INTO prompt_eval_runs (workspace_id, run_ref, prompt, models, summary)"
    " VALUES ($1, 'r1', 'p', '{m}', '{}') RETURNING id, workspace_id)"
    " INSERT INTO prompt_eval_results (run_id, workspace_id, model, case_id, passed, scores)"
    " SELECT id, workspace_id, 'm', 'c1', true, '{}' FROM r",
    "INSERT INTO podcast_stats_salts (workspace_id, day, salt) VALUES ($1, current_date, 'x')",
]
READABLE = [
    "transcripts",
    "transcript_segments",
    "ai_results",
    "podcast_downloads_daily",
    "knowledge_nodes",
    "valgomat_questions",
    "valgomat_profiles",
    "valgomat_moderation",
    "prompt_eval_runs",
    "prompt_eval_results",
]
WORKER_ONLY = ["podcast_stats_salts", "podcast_listener_days", "podcast_log_files"]


async def test_workspace_owned_tables_have_the_same_policies(
    pool: asyncpg.Pool, db_url: str, make_role: RoleMaker
) -> None:
    a, b = await two_workspaces(pool)
    for sql in OWNED_ROWS:
        for ws in (a, b):
            await pool.execute(sql, ws)
    web = await make_role(WEB)
    async with connected(db_url, web) as conn:
        for table in READABLE:
            assert await conn.fetchval(f"SELECT count(*) FROM {table}") == 0, table
            async with conn.transaction():
                await in_workspace(conn, a)
                seen = await conn.fetch(f"SELECT DISTINCT workspace_id FROM {table}")
            assert [r[0] for r in seen] == [a], table
        for table in WORKER_ONLY:
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.fetchval(f"SELECT count(*) FROM {table}")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):  # no writing into B's graph
            async with conn.transaction():
                await in_workspace(conn, a)
                await conn.execute(
                    "INSERT INTO knowledge_nodes (workspace_id, node_id, content)"
                    " VALUES ($1, 'n2', 'x')",
                    b,
                )


async def test_every_table_keyed_by_workspace_has_row_level_security(pool: asyncpg.Pool) -> None:
    """A new workspace-owned table (knowledge_embeddings, where pgvector is) is caught here: each
    table with a workspace_id column either is closed to the web role or carries a policy for
    it; and no policy is left for PUBLIC, which would open a table to every role."""
    rows = await pool.fetch(
        "SELECT c.relname, c.relrowsecurity,"
        "       has_table_privilege('sidelinja_app', c.oid, 'SELECT,INSERT,UPDATE,DELETE') AS app,"
        "       EXISTS (SELECT 1 FROM pg_policy p WHERE p.polrelid = c.oid"
        "               AND 'sidelinja_app'::regrole = ANY(p.polroles)) AS app_policy"
        " FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid"
        " WHERE c.relkind = 'r' AND c.relnamespace = 'public'::regnamespace"
        "   AND a.attname = 'workspace_id' AND NOT a.attisdropped"
    )
    assert {r["relname"] for r in rows} >= {"job_queue", *READABLE, *WORKER_ONLY}
    for r in rows:
        if r["app"]:
            assert r["relrowsecurity"] and r["app_policy"], r["relname"]
        if r["relname"] in READABLE or r["relname"] in WORKER_ONLY:
            assert r["relrowsecurity"], r["relname"]
    assert await pool.fetchval("SELECT count(*) FROM pg_policy WHERE 0::oid = ANY(polroles)") == 0


async def test_bulk_enqueue_under_row_level_security(
    pool: asyncpg.Pool, db_url: str, make_role: RoleMaker
) -> None:
    """The INSERT path works for the web role's own workspace and is refused for another; the
    COPY path (64 jobs or more without keys or delays) is refused by PostgreSQL with a clear
    error, since COPY FROM does not apply row-level security, and writes nothing."""
    a, b = await two_workspaces(pool)
    web = await make_role(WEB)
    async with connected(db_url, web) as conn:
        async with conn.transaction():
            await in_workspace(conn, a)
            ids = await client.enqueue_many(conn, [NewJob(a, "noop") for _ in range(10)])
        assert len(ids) == 10
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            async with conn.transaction():
                await in_workspace(conn, a)
                await client.enqueue_many(conn, [NewJob(b, "noop") for _ in range(10)])
        with pytest.raises(asyncpg.FeatureNotSupportedError, match="row-level security"):
            async with conn.transaction():
                await in_workspace(conn, a)
                await client.enqueue_many(conn, [NewJob(a, "noop") for _ in range(100)])
    assert await pool.fetchval("SELECT count(*) FROM job_queue WHERE workspace_id = $1", a) == 13
    assert await pool.fetchval("SELECT count(*) FROM job_queue WHERE workspace_id = $1", b) == 2


async def test_a_unique_key_held_out_of_sight_fails_instead_of_looping(
    pool: asyncpg.Pool, db_url: str, make_role: RoleMaker
) -> None:
    """A holder that the enqueuer's policies hide makes the insert skip and the look-up find
    nothing: the retries are bounded and end in a clear error, not a RecursionError."""
    a, _b = await two_workspaces(pool)
    await pool.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload, status, unique_key)"
        " VALUES ($1, 'noop', '{}', 'running', 'nightly')",
        a,
    )
    web = await make_role(
        WEB,
        OLD_GRANTS,
        "CREATE POLICY sw_hide_running ON job_queue AS RESTRICTIVE FOR SELECT TO {r}"
        " USING (status <> 'running')",
    )
    async with connected(db_url, web) as conn, conn.transaction():
        await in_workspace(conn, a)
        with pytest.raises(client.UniqueKeyUnresolved, match="held by a job this connection"):
            await client.enqueue(conn, a, "noop", {}, unique_key="nightly")
