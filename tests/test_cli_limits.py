"""`limits` as an operator types it: names that match nothing are refused in one line."""

from __future__ import annotations

from uuid import uuid4

import asyncpg

from tests.helpers import cli, one_line_error


async def test_a_cap_on_a_workspace_that_does_not_exist_is_one_clear_error(
    db_url: str, pool: asyncpg.Pool
) -> None:
    missing = uuid4()
    out = cli("limits", "workspace", str(missing), "3", url=db_url)
    assert out.returncode == 2
    assert one_line_error(out) == f"sidelinja-worker: error: no workspace {missing}"
    assert await pool.fetchval("SELECT count(*) FROM workspace_limits") == 0


async def test_a_cap_on_an_unknown_job_type_is_refused_and_a_stray_one_can_go(
    db_url: str, pool: asyncpg.Pool
) -> None:
    out = cli("limits", "type", "whisper_transcrib", "1", url=db_url)  # a typo caps nothing
    assert out.returncode == 2
    assert one_line_error(out).startswith(
        "sidelinja-worker: error: unknown job type 'whisper_transcrib'; known: "
    )
    assert await pool.fetchval("SELECT count(*) FROM job_type_limits") == 0
    await pool.execute("INSERT INTO job_type_limits (job_type, max_running) VALUES ('gone', 1)")
    removed = cli("limits", "type", "gone", "none", url=db_url)
    assert removed.returncode == 0, removed.stderr
    assert await pool.fetchval("SELECT count(*) FROM job_type_limits") == 0
