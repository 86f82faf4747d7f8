"""`pause` and `resume` as an operator types them: the same words as the other commands."""

from __future__ import annotations

import asyncio
from uuid import UUID

import asyncpg

from sidelinja_worker.jobs.catalog import REGISTRY
from sidelinja_worker.queue import store
from tests.helpers import cli, one_line_error


def test_an_unknown_type_names_the_known_ones_as_enqueue_does(db_url: str) -> None:
    line = one_line_error(cli("pause", "nope", "--reason", "x", url=db_url))
    assert line == (
        f"sidelinja-worker: error: unknown job type 'nope'; known: {', '.join(sorted(REGISTRY))}"
    )


async def test_pause_takes_what_the_admin_view_takes_and_resume_any_paused_name(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """A type no worker here runs but jobs have (a plain-SQL writer enqueued it) may be paused,
    as in the admin view; a pause plain SQL made of any name may be lifted. Before, both were
    'unknown job type' (the SQL-made pause could not be lifted from the command line)."""
    await pool.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload) VALUES ($1, 'web_only', '{}')",
        workspace,
    )
    paused = await asyncio.to_thread(
        cli, "pause", "web_only", "--reason", "its service is down", url=db_url
    )
    assert paused.returncode == 0 and "paused web_only" in paused.stdout, paused.stderr
    await pool.execute(
        "INSERT INTO job_type_pauses (job_type, paused_by, reason) VALUES ('old_name', 'sql', 'x')"
    )
    resumed = await asyncio.to_thread(cli, "resume", "old_name", url=db_url)
    assert resumed.returncode == 0 and "resumed old_name" in resumed.stdout, resumed.stderr
    never = await asyncio.to_thread(cli, "resume", "nope", url=db_url)
    assert never.returncode == 0 and "nope was not paused" in never.stdout, never.stderr


async def test_the_pause_list_names_an_admin_token_by_its_label(
    pool: asyncpg.Pool, db_url: str
) -> None:
    """A pause made in the admin view names its token by id, which tells a reader nothing; the
    list says the token's label, as the admin view does, and the id once the token is gone."""
    token = await pool.fetchval(
        "INSERT INTO admin_tokens (token_sha256, all_workspaces, label)"
        " VALUES ('\\x00', true, 'on-call laptop') RETURNING id"
    )
    await pool.execute(
        "INSERT INTO job_type_pauses (job_type, paused_by, reason) VALUES ('noop', $1, 'x')",
        f"admin token {token}",
    )
    shown = await asyncio.to_thread(cli, "pause", url=db_url)
    assert "by on-call laptop (x)" in shown.stdout, shown.stdout
    await pool.execute("DELETE FROM admin_tokens")
    shown = await asyncio.to_thread(cli, "pause", url=db_url)
    assert f"by admin token {token} (x)" in shown.stdout, shown.stdout


async def test_the_oldest_due_job_leaves_out_the_types_an_operator_paused(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """Before, a paused type's waiting jobs were the oldest due job for as long as the pause
    lasted: an alert on the gauge fired throughout, and a queue that fell behind meanwhile
    showed nothing new."""
    await pool.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload, scheduled_for)"
        " VALUES ($1, 'web_only', '{}', now() - interval '1 hour')",
        workspace,
    )
    assert await store.oldest_due_s(pool) > 3500
    paused = await asyncio.to_thread(cli, "pause", "web_only", "--reason", "down", url=db_url)
    assert paused.returncode == 0, paused.stderr
    assert await store.oldest_due_s(pool) is None
    await pool.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload, scheduled_for)"
        " VALUES ($1, 'noop', '{}', now() - interval '1 minute')",
        workspace,
    )
    assert 50 < await store.oldest_due_s(pool) < 600
    [listed] = await store.list_pauses(pool)
    assert (listed["job_type"], listed["waiting"]) == ("web_only", 1)
