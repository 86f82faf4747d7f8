"""Text any writer may have put in the tables, printed by the CLI as text: ESC sequences would
retitle or recolour the operator's terminal, and a newline would print a row of its own."""

from __future__ import annotations

import json
from pathlib import Path

import asyncpg

from tests.helpers import cli

EVIL = "x\x1b]0;pwned\x07\x1b[31m\nfake-row"


async def test_a_workspace_name_written_by_sql_prints_as_text_on_one_line(
    db_url: str, pool: asyncpg.Pool
) -> None:
    await pool.execute("INSERT INTO workspaces (id, name) VALUES (gen_random_uuid(), $1)", EVIL)
    out = cli("workspace", "list", url=db_url)
    assert out.returncode == 0, out.stderr
    assert "\x1b" not in out.stdout and "\x07" not in out.stdout
    (line,) = out.stdout.splitlines()
    assert "pwned" in line and "fake-row" in line


async def test_pauses_and_limits_written_by_sql_print_as_text(
    db_url: str, pool: asyncpg.Pool
) -> None:
    await pool.execute(
        "INSERT INTO job_type_pauses (job_type, paused_by, reason) VALUES ($1, $1, $1)", EVIL
    )
    await pool.execute("INSERT INTO job_type_limits (job_type, max_running) VALUES ($1, 1)", EVIL)
    await pool.execute("INSERT INTO rate_limits (key, max_requests, per_s) VALUES ($1, 1, 1)", EVIL)
    for command in ("pause", "limits"):
        out = cli(command, url=db_url)
        assert out.returncode == 0, out.stderr
        assert "\x1b" not in out.stdout and "\x07" not in out.stdout
        assert not any(line.startswith("fake-row") for line in out.stdout.splitlines())


async def test_a_database_url_with_escapes_prints_as_text(db_url: str) -> None:
    for url in (f"{db_url}?application_name={EVIL}", f"postgresql://u@127.0.0.1:1/db{EVIL}"):
        out = cli("workspace", "list", url=url)
        assert "\x1b" not in out.stderr and "\x07" not in out.stderr, out.stderr
        assert not any(line.startswith("fake-row") for line in out.stderr.splitlines())
        assert "\\x1b]0;pwned" in out.stderr


async def test_keys_of_a_jsonl_line_print_as_text(
    db_url: str, pool: asyncpg.Pool, tmp_path: Path
) -> None:
    workspace = await pool.fetchval(
        "INSERT INTO workspaces (id, name) VALUES (gen_random_uuid(), 'w') RETURNING id"
    )
    key = json.dumps(EVIL)
    lines = tmp_path / "jobs.jsonl"
    lines.write_text(
        f'{{"job_type": "noop", {key}: 1}}\n{{"job_type": "noop", "payload": {{{key}: 1e999}}}}\n'
    )
    for more in ((), ("--skip-bad",)):
        out = cli("enqueue", "--file", str(lines), "--workspace", str(workspace), *more, url=db_url)
        assert "\x1b" not in out.stderr and "\x07" not in out.stderr, out.stderr
        assert not any(line.startswith("fake-row") for line in out.stderr.splitlines())
        assert "\\x1b]0;pwned" in out.stderr
