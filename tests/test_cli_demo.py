"""`demo` on a database it does not own, and rows rewritten under it while it runs."""

from __future__ import annotations

from uuid import UUID

import asyncpg

from tests.helpers import cli, insert_jobs, one_line_error


async def test_demo_refuses_a_database_with_other_workspaces_jobs(
    db_url: str, pool: asyncpg.Pool, workspace: UUID
) -> None:
    await insert_jobs(pool, workspace, 1)
    out = cli("demo", url=db_url)
    assert "jobs outside the demo's workspace" in one_line_error(out)
    assert out.returncode == 2
    rows = await pool.fetch("SELECT workspace_id, status::text, attempts FROM job_queue")
    assert [tuple(r) for r in rows] == [(workspace, "pending", 0)]


async def test_demo_prints_rows_rewritten_under_it_as_text(db_url: str, pool: asyncpg.Pool) -> None:
    # What a role writing job_queue can do to the demo's rows while they run, done by a trigger
    # so that it is there at every outcome.
    await pool.execute(
        r"""
        CREATE FUNCTION hostile_outcome() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.error_msg IS NOT NULL THEN
                NEW.error_msg := E'\x1b]0;PWNED\x07\x1b[2J' || NEW.error_msg;
            END IF;
            IF NEW.result IS NOT NULL THEN
                NEW.result := jsonb_build_object('x', E'\u202e\u009b31m');
            END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER hostile_outcome BEFORE UPDATE ON job_queue
            FOR EACH ROW EXECUTE FUNCTION hostile_outcome();
        """
    )
    out = cli("demo", url=db_url)
    assert out.returncode == 0, out.stderr
    for raw in ("\x1b", "\x07", "\u202e", "\x9b"):
        assert raw not in out.stdout
    assert "\\x1b]0;PWNED" in out.stdout
