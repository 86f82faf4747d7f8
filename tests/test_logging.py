"""What the worker logs at its default level: no line per successful job, a summary of the
completions per job type, and every failure with its job's fields."""

from __future__ import annotations

import asyncio
import logging
from typing import Any
from uuid import UUID

import asyncpg
import orjson
import pytest

from sidelinja_worker.queue import logs
from tests.helpers import cli, insert_jobs, statuses

PER_JOB_SUCCESS = "completed (attempt"


def json_lines(stderr: str) -> list[dict[str, Any]]:
    return [orjson.loads(ln) for ln in stderr.splitlines() if ln.startswith("{")]


async def burst(url: str, level: str | None) -> list[dict[str, Any]]:
    env = {"SIDELINJA_LOG_FORMAT": "json"}
    if level is not None:
        env["SIDELINJA_LOG_LEVEL"] = level
    proc = await asyncio.to_thread(
        cli, "run", "--burst", "--max-concurrent", "20", url=url, env=env
    )
    assert proc.returncode == 0, proc.stderr
    return json_lines(proc.stderr)


async def test_default_level_logs_a_summary_not_a_line_per_job(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    await insert_jobs(pool, workspace, 300)
    lines = await burst(db_url, None)
    assert not [ln for ln in lines if PER_JOB_SUCCESS in ln["msg"]], lines[:5]
    summaries = [ln for ln in lines if ln["logger"] == "sidelinja_worker.summary"]
    completed = (await statuses(pool)).get("completed", 0)
    assert completed >= 300
    # One short run: one window, written at exit, with the count per type.
    assert len(summaries) == 1, summaries
    assert summaries[0]["level"] == "info"
    assert summaries[0]["completed"] == completed
    assert summaries[0]["by_type"] == {"noop": completed}
    assert f"completed {completed} jobs in the last" in summaries[0]["msg"]
    assert "job_id" not in summaries[0]  # the summary is no job's line


async def test_debug_level_logs_each_success(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    await insert_jobs(pool, workspace, 25)
    lines = await burst(db_url, "debug")
    per_job = [ln for ln in lines if PER_JOB_SUCCESS in ln["msg"]]
    assert len(per_job) == 25
    assert all(ln["level"] == "debug" and ln["job_type"] == "noop" for ln in per_job)


async def test_failures_stay_at_info_with_their_job_fields(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    await pool.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload, max_attempts)"
        " VALUES ($1, 'noop', '{\"fail_permanent\": \"boom\"}', 3)",
        workspace,
    )
    lines = await burst(db_url, None)
    failed = [ln for ln in lines if "failed for good" in ln["msg"]]
    assert len(failed) == 1, lines
    assert failed[0]["job_type"] == "noop"
    assert failed[0]["workspace_id"] == str(workspace)
    assert failed[0]["attempt"] == 1 and failed[0]["max_attempts"] == 3
    assert failed[0]["level"] == "warning" and "boom" in failed[0]["msg"]


async def test_the_summary_timer_writes_each_window(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """In a long run the timer writes a line per window, without the completing job's fields."""
    monkeypatch.setattr(logs, "SUMMARY_INTERVAL_S", 0.05)
    logs.flush_summary()  # counts left by other tests in this process
    caplog.set_level(logging.INFO, logger="sidelinja_worker.summary")
    caplog.clear()

    class Job:
        id = workspace_id = UUID(int=1)
        job_type = "a"
        attempt = max_attempts = 1

    async def job_task() -> None:
        logs.bind_job(Job())
        for name in ("a", "a", "b"):
            logs.count_completed(name)

    await asyncio.create_task(job_task())
    deadline = asyncio.get_running_loop().time() + 5
    while not caplog.records and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.01)
    assert [r.getMessage().split(" (")[1] for r in caplog.records] == ["a: 2, b: 1)"]
    record = caplog.records[0]
    assert record.summary["completed"] == 3  # type: ignore[attr-defined]
    assert '"job_id"' not in logs.JsonFormatter().format(record)
    logs.count_completed("c")  # the next window arms its own timer
    while len(caplog.records) < 2 and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.01)
    assert caplog.records[1].summary["by_type"] == {"c": 1}  # type: ignore[attr-defined]


# A failure's message is any text a plain-SQL payload (here noop's own) or an outside service's
# answer puts there: a terminal title and bell, a line break starting a forged line, a colour,
# C1's CSI and a bidi override.
HOSTILE = "boom\x1b]0;pwned\x07\n12:00:00 INFO forged line\x1b[31m red \x9b2J \u202eesrever"


@pytest.mark.parametrize("log_format", ["text", "json"])
async def test_a_hostile_message_never_reaches_the_terminal_raw(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, log_format: str
) -> None:
    """A text log line carried a failure's message as it was: its escape sequences retitled,
    cleared or coloured the operator's terminal, and its line break started a line that read
    like the worker's own. Every control and bidi character is written as its escape; a JSON
    line, which escapes C0 already, escapes C1 and bidi too, and reads back the same."""
    await pool.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload, max_attempts)"
        " VALUES ($1, 'noop', jsonb_build_object('fail_permanent', $2::text), 1)",
        workspace,
        HOSTILE,
    )
    env = {"SIDELINJA_LOG_FORMAT": log_format}
    proc = await asyncio.to_thread(cli, "run", "--burst", url=db_url, env=env)
    assert proc.returncode == 0, proc.stderr
    for raw in ("\x1b", "\x07", "\x9b", "\u202e"):
        assert raw not in proc.stderr, (raw, proc.stderr)
    assert not [ln for ln in proc.stderr.splitlines() if ln.startswith("12:00:00 INFO forged")]
    if log_format == "text":
        failed = [ln for ln in proc.stderr.splitlines() if "failed for good" in ln]
        assert len(failed) == 1, proc.stderr
        assert "boom\\x1b]0;pwned\\x07\\n12:00:00 INFO forged line\\x1b[31m" in failed[0]
    else:
        failed = [ln for ln in json_lines(proc.stderr) if "failed for good" in ln["msg"]]
        assert len(failed) == 1, proc.stderr
        assert HOSTILE in failed[0]["msg"]
