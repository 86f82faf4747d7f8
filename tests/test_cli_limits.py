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


async def test_a_rate_on_an_unknown_key_is_refused_and_an_existing_row_can_change(
    db_url: str, pool: asyncpg.Pool
) -> None:
    out = cli("limits", "rate", "ai_gatway", "20/1m", url=db_url)  # a typo spaces no call
    assert out.returncode == 2
    assert one_line_error(out) == (
        "sidelinja-worker: error: unknown rate key 'ai_gatway'; known: ai_gateway"
    )
    assert await pool.fetchval("SELECT count(*) FROM rate_limits") == 0
    known = cli("limits", "rate", "ai_gateway", "20/1m", url=db_url)
    assert known.returncode == 0, known.stderr
    # A row written by SQL (or by an older version) stays the operator's to change or remove.
    await pool.execute("INSERT INTO rate_limits (key, max_requests, per_s) VALUES ('old', 1, 1)")
    changed = cli("limits", "rate", "old", "5/1s", url=db_url)
    assert changed.returncode == 0, changed.stderr
    assert await pool.fetchval("SELECT max_requests FROM rate_limits WHERE key = 'old'") == 5
    removed = cli("limits", "rate", "old", "none", url=db_url)
    assert removed.returncode == 0, removed.stderr
    assert await pool.fetchval("SELECT array_agg(key) FROM rate_limits") == ["ai_gateway"]
