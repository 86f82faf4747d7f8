"""The program as a user meets it: help, enqueue, types, and one clear line for bad input."""

from __future__ import annotations

import json
from uuid import UUID, uuid4

import asyncpg
import pytest

from tests.helpers import cli, one_line_error


def test_help_lists_subcommands_and_each_has_help() -> None:
    top = cli("--help", url=None)
    assert top.returncode == 0
    for command in ("migrate", "enqueue", "run", "types", "demo", "jobs"):
        assert command in top.stdout
        assert cli(command, "--help", url=None).returncode == 0


def test_types_lists_noop_with_priority() -> None:
    out = cli("types", url=None)
    assert out.returncode == 0
    assert any(line.split()[:2] == ["noop", "0"] for line in out.stdout.splitlines())


async def test_enqueue_prints_the_id_and_run_completes_it(
    db_url: str, pool: asyncpg.Pool, workspace: UUID
) -> None:
    out = cli(
        "enqueue",
        "noop",
        "--workspace",
        str(workspace),
        "--payload",
        '{"a": 1}',
        "--priority",
        "4",
        url=db_url,
    )
    assert out.returncode == 0, out.stderr
    job_id = UUID(out.stdout.strip())
    later = cli("enqueue", "noop", "--workspace", str(workspace), "--in", "10m", url=db_url)
    assert later.returncode == 0, later.stderr
    run = cli("run", "--burst", url=db_url)
    assert run.returncode == 0, run.stderr
    row = await pool.fetchrow(
        "SELECT status::text, priority, result FROM job_queue WHERE id = $1", job_id
    )
    assert tuple(row) == ("completed", 4, {"a": 1})
    waiting = await pool.fetchval(
        "SELECT status::text FROM job_queue WHERE id = $1", UUID(later.stdout.strip())
    )
    assert waiting == "pending"  # not due for ten minutes
    shown = cli("jobs", "show", str(job_id), url=db_url)
    assert json.loads(shown.stdout)["status"] == "completed"


async def test_log_level_quiets_the_line_per_job(
    db_url: str, pool: asyncpg.Pool, workspace: UUID
) -> None:
    await pool.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload) VALUES ($1, 'noop', '{}')",
        workspace,
    )
    chatty = cli("run", "--burst", url=db_url, env={"SIDELINJA_LOG_FORMAT": "text"})
    await pool.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload) VALUES ($1, 'noop', '{}')",
        workspace,
    )
    quiet = cli(
        "--log-level", "warning", "run", "--burst", url=db_url, env={"SIDELINJA_LOG_FORMAT": "text"}
    )
    assert chatty.returncode == quiet.returncode == 0, (chatty.stderr, quiet.stderr)
    assert "completed" in chatty.stderr and "completed" not in quiet.stderr
    assert await pool.fetchval("SELECT count(*) FROM job_queue WHERE status = 'completed'") == 2
    bad = cli("run", "--burst", url=db_url, env={"SIDELINJA_LOG_LEVEL": "loud"})
    assert "SIDELINJA_LOG_LEVEL must be one of" in one_line_error(bad)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--payload", "[1, 2]"], "--payload must be a JSON object"),
        (["--payload", "{nope"], "--payload is not JSON"),
        (["--in", "soon"], "bad duration 'soon'"),
    ],
)
async def test_bad_enqueue_input_is_one_line_and_writes_nothing(
    db_url: str, pool: asyncpg.Pool, workspace: UUID, args: list[str], expected: str
) -> None:
    out = cli("enqueue", "noop", "--workspace", str(workspace), *args, url=db_url)
    assert expected in one_line_error(out)
    assert await pool.fetchval("SELECT count(*) FROM job_queue") == 0


async def test_unknown_job_type_and_bad_workspace(db_url: str, pool: asyncpg.Pool) -> None:
    unknown = cli("enqueue", "transcribe_everything", "--workspace", str(uuid4()), url=db_url)
    message = one_line_error(unknown)
    assert "unknown job type 'transcribe_everything'; known: " in message and "noop" in message
    not_uuid = cli("enqueue", "noop", "--workspace", "ws-1", url=db_url)
    assert "--workspace 'ws-1' is not a UUID" in one_line_error(not_uuid)
    missing = cli("enqueue", "noop", "--workspace", str(uuid4()), url=db_url)
    assert "no workspace" in one_line_error(missing)
    assert await pool.fetchval("SELECT count(*) FROM job_queue") == 0


def test_run_rejects_unknown_types_and_bad_durations(db_url: str) -> None:
    message = one_line_error(cli("run", "--types", "noop,bogus", "--burst", url=db_url))
    assert "unknown job types in --types: bogus; known: " in message and "noop" in message
    assert "bad duration '1 sekund'" in one_line_error(
        cli("run", "--poll-interval", "1 sekund", "--burst", url=db_url)
    )
    assert "bad duration 'x'" in one_line_error(
        cli("run", "--burst", url=db_url, env={"SIDELINJA_LEASE": "x"})
    )


def test_unreachable_database_is_one_line() -> None:
    out = cli("run", "--burst", url="postgresql://postgres@127.0.0.1:1/nowhere")
    assert (
        "cannot connect to the database at postgresql://postgres@127.0.0.1:1/nowhere"
        in one_line_error(out)
    )


def test_password_never_shown() -> None:
    out = cli("migrate", url="postgresql://postgres:hemmelig@127.0.0.1:1/x")
    assert "hemmelig" not in out.stderr and "***" in one_line_error(out)


def test_unmigrated_database_is_one_line(empty_db_url: str) -> None:
    out = cli("run", "--burst", url=empty_db_url)
    assert "the database is not migrated" in one_line_error(out)
    assert "sidelinja-worker migrate" in out.stderr


def test_debug_shows_the_traceback(empty_db_url: str) -> None:
    out = cli("--debug", "run", "--burst", url=empty_db_url)
    assert out.returncode != 0 and "Traceback" in out.stderr


def test_demo_runs_every_job_type_that_needs_no_service(db_url: str) -> None:
    out = cli("demo", url=db_url)
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line for line in out.stdout.splitlines() if line[:1].isalpha()}
    assert "completed" in rows["transcript"] and '"segments": 10' in rows["transcript"]
    assert "completed" in rows["downloads"] and '"new_downloads": 4' in rows["downloads"]
    assert "error" in rows["flaky"] and "the service answered 503" in rows["flaky"]
    assert "AI_GATEWAY_URL" in out.stdout  # the unconfigured types say what to set


async def test_service_settings_are_flags_too(
    db_url: str, pool: asyncpg.Pool, workspace: UUID
) -> None:
    job_id = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload, max_attempts)"
        " VALUES ($1, 'research_clip', '{\"text\": \"hei\"}', 1) RETURNING id",
        workspace,
    )
    env = {"AI_GATEWAY_URL": "", "AI_GATEWAY_KEY": ""}
    assert cli("run", "--burst", url=db_url, env=env).returncode == 0
    message = await pool.fetchval("SELECT error_msg FROM job_queue WHERE id = $1", job_id)
    assert "AI_GATEWAY_URL" in message and "not set" in message
    await pool.execute(
        "UPDATE job_queue SET status = 'pending', attempts = 0 WHERE id = $1", job_id
    )
    flags = ("--ai-gateway-url", "http://127.0.0.1:1/api/v1", "--ai-gateway-key", "sk-hemmelig")
    assert cli("run", "--burst", *flags, url=db_url, env=env).returncode == 0
    message = await pool.fetchval("SELECT error_msg FROM job_queue WHERE id = $1", job_id)
    assert "not set" not in message and "hemmelig" not in message  # it tried the gateway
