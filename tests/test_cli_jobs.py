"""`jobs list` as a script and an operator meet it: JSON a parser takes, limits said plainly."""

from __future__ import annotations

import json
from datetime import datetime
from uuid import UUID

import asyncpg
import pytest

from tests.helpers import cli, one_line_error


@pytest.mark.parametrize("limit", ["0", "-1"])
async def test_a_limit_below_one_is_refused(db_url: str, limit: str) -> None:
    out = cli("jobs", "list", "--limit", limit, url=db_url)
    assert out.returncode == 2
    assert one_line_error(out) == "sidelinja-worker: error: --limit: 1 to 100,000"


async def test_json_times_are_iso_8601_as_jobs_show_gives_them(
    db_url: str, pool: asyncpg.Pool, workspace: UUID
) -> None:
    job_id = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload) VALUES ($1, 'noop', '{}') RETURNING id",
        workspace,
    )
    listed = cli("jobs", "list", "--status", "all", "--json", url=db_url)
    assert listed.returncode == 0, listed.stderr
    (row,) = json.loads(listed.stdout)
    shown = json.loads(cli("jobs", "show", str(job_id), url=db_url).stdout)
    assert row["created_at"] == shown["created_at"]
    assert "T" in row["created_at"] and datetime.fromisoformat(row["created_at"]).tzinfo


def test_the_help_names_every_status() -> None:
    text = " ".join(cli("jobs", "list", "--help", url=None).stdout.split())
    assert "error, retry, pending, waiting, running, completed, cancelled or all" in text
    assert "then retry, running, pending, waiting, cancelled, completed" in " ".join(
        cli("jobs", "--help", url=None).stdout.split()
    )


async def test_the_table_shows_each_job_type_whole_and_marks_a_cut_error(
    db_url: str, pool: asyncpg.Pool, workspace: UUID
) -> None:
    await pool.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload, status, error_msg)"
        " VALUES ($1, 'valgomat_generate_profile', '{}', 'error', repeat('x', 100)),"
        "        ($1, 'noop', '{}', 'error', 'short')",
        workspace,
    )
    out = cli("jobs", "list", url=db_url)
    assert out.returncode == 0, out.stderr
    header, *rows = out.stdout.splitlines()
    by_type = {row.split()[1]: row for row in rows}
    assert sorted(by_type) == ["noop", "valgomat_generate_profile"]
    assert {row.index(" error ") for row in rows} == {header.index("STATUS") - 1}
    assert by_type["valgomat_generate_profile"].endswith(" " + "x" * 59 + "…")
    assert by_type["noop"].endswith(" short")
