"""Hostile input through real jobs: each hostile job runs beside a chain of no-op jobs on a
worker with two slots, and every no-op completes within 1 s of starting: the hostile input is
parsed off the event loop, in linear time, and fails (or passes) with its documented outcome."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import asyncpg
import orjson
import pytest

from sidelinja_worker.jobs.transcripts.subtitles import vtt_time
from sidelinja_worker.queue import client
from sidelinja_worker.queue.config import ServiceConfig
from tests.fakes.ai_gateway_server import FakeAiGateway, ai_gateway_fixture  # noqa: F401
from tests.fakes.fixtures import allow_models
from tests.fakes.hostile_server import hostile_server, json_answer
from tests.helpers import run_burst
from tests.test_stats_job import ln

NOOPS = 40  # x 50 ms: a chain of no-ops covering the hostile job's run


async def beside_noops(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, hostile: UUID, config: ServiceConfig
) -> asyncpg.Record:
    """Runs the (already enqueued) hostile job beside no-ops; asserts every no-op took under
    1 s and that one of them ran while the hostile job did. Returns the hostile job's row."""
    noops = [await client.enqueue(pool, workspace, "noop", {"sleep_ms": 50}) for _ in range(NOOPS)]
    await run_burst(pool, db_url, config=config, max_concurrent=2)
    rows = await pool.fetch(
        "SELECT id, status, started_at, completed_at FROM job_queue WHERE id = ANY($1)",
        [hostile, *noops],
    )
    by_id = {r["id"]: r for r in rows}
    job = by_id.pop(hostile)
    assert all(r["status"] == "completed" for r in by_id.values())
    slowest = max(r["completed_at"] - r["started_at"] for r in by_id.values())
    assert slowest < timedelta(seconds=1), slowest
    assert any(
        r["started_at"] <= job["completed_at"] and r["completed_at"] >= job["started_at"]
        for r in by_id.values()
    )
    return job


async def _error(pool: asyncpg.Pool, job_id: UUID) -> tuple[str, int, str]:
    row = await pool.fetchrow(
        "SELECT status, attempts, error_msg FROM job_queue WHERE id = $1", job_id
    )
    return row["status"], row["attempts"], row["error_msg"]


def _cues(count: int) -> str:
    return "".join(
        f"{i + 1}\n{vtt_time(i * 1000).replace('.', ',')} --> "
        f"{vtt_time(i * 1000 + 900).replace('.', ',')}\nHei <i>du</i> &amp; meg\n\n"
        for i in range(count)
    )


@pytest.mark.parametrize(
    ("content", "error"),
    [
        (
            "1\n00:00:01,000 --> 00:00:02,000\n" + "a" * 19_000_000 + "\n",
            "malformed SRT at line 3: the line is 19000000 characters long (at most 20000)",
        ),
        (
            _cues(150_000) + "99\nbroken\n",  # 10 MB parsed to its end before the bad line
            "malformed SRT at line 600002: expected a timing line after the cue number, "
            "got 'broken'",
        ),
        ("x" * 21_000_000, "'big.srt' is over 20971520 bytes: not an SRT"),
    ],
    ids=["one-enormous-line", "ten-megabytes-then-broken", "over-the-size-cap"],
)
async def test_a_hostile_srt_fails_precisely_beside_a_responsive_worker(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, tmp_path: Path, content: str, error: str
) -> None:
    folder = tmp_path / str(workspace)
    folder.mkdir()
    (folder / "big.srt").write_text(content, "utf-8")
    job_id = await client.enqueue(
        pool, workspace, "srt_parse", {"transcript_ref": "x", "srt_path": "big.srt"}
    )
    await beside_noops(
        pool, db_url, workspace, job_id, ServiceConfig({"MEDIA_ROOT": str(tmp_path)})
    )
    assert await _error(pool, job_id) == ("error", 1, error)


async def test_catastrophic_regexes_run_in_linear_time_beside_a_responsive_worker(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, ai_gateway: FakeAiGateway
) -> None:
    await allow_models(pool, workspace, "m/one")
    ai_gateway.plain_answer = lambda r: "a" * 40_000 + "!"
    expect: list[dict[str, Any]] = [
        {"kind": "regex", "pattern": "^(a+)+$"},  # hours on a backtracking engine
        {"kind": "regex", "pattern": "(a|aa)*!"},
    ]
    job_id = await client.enqueue(
        pool,
        workspace,
        "prompt_eval",
        {"prompt": "p", "cases": [{"id": "c", "expect": expect}], "models": ["m/one"]},
    )
    config = ServiceConfig({"AI_GATEWAY_URL": ai_gateway.url, "AI_GATEWAY_KEY": ai_gateway.key})
    job = await beside_noops(pool, db_url, workspace, job_id, config)
    assert job["status"] == "completed"
    scores = await pool.fetchval("SELECT scores FROM prompt_eval_results WHERE case_id = 'c'")
    assert [(s["passed"], s["detail"]) for s in scores] == [(False, None), (True, None)]


async def test_over_long_log_lines_are_dropped_and_the_rest_counted(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, tmp_path: Path
) -> None:
    logs = tmp_path / str(workspace) / "logs"
    logs.mkdir(parents=True)
    (logs / "access.log").write_bytes(
        ln(ip="198.51.100.1", status=200, range_=None, size=10_000_000)
        + b'{"request": {"uri": "'
        + b"x" * 3_000_000
        + b'"}}\n'
        + ln(ip="198.51.100.2", status=200, range_=None, size=10_000_000)
    )
    job_id = await client.enqueue(
        pool, workspace, "stats_parse", {"logs": "logs", "schedule": False}
    )
    job = await beside_noops(
        pool, db_url, workspace, job_id, ServiceConfig({"MEDIA_ROOT": str(tmp_path)})
    )
    assert job["status"] == "completed"
    result = await pool.fetchval("SELECT result FROM job_queue WHERE id = $1", job_id)
    # The line's first MAX_LINE_BYTES are dropped unread; its tail is one bad line.
    assert (
        result["lines"],
        result["bad_lines"],
        result["requests_counted"],
        result["new_downloads"],
    ) == (3, 1, 2, 2)


async def test_an_enormous_model_answer_is_parsed_off_the_loop_beside_a_responsive_worker(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    # 15 MB of JSON whose answer is not the schema: parsed, validated, asked again, refused.
    content = orjson.dumps({"summary": ["x" * 50] * 250_000}).decode()
    body = orjson.dumps({"choices": [{"message": {"content": content}}]})
    async with hostile_server(json_answer(body)) as server:
        job_id = await client.enqueue(pool, workspace, "meeting_summarize", {"text": "møte"})
        config = ServiceConfig({"AI_GATEWAY_URL": server.url, "AI_GATEWAY_KEY": "k"})
        await beside_noops(pool, db_url, workspace, job_id, config)
        assert len(server.requests) == 2  # the answer, and the one retry with the error
    status, attempts, error = await _error(pool, job_id)
    assert (status, attempts) == ("error", 1)
    assert error.startswith("the model's answer did not match the Minutes schema twice: ")


async def test_a_models_endless_task_lists_are_merged_in_linear_time_beside_a_responsive_worker(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, ai_gateway: FakeAiGateway
) -> None:
    # A split dictation's notes are merged on the event loop; a model that loops answers each
    # part with thousands of tasks (60 kB), the later parts repeating the earlier ones.
    await pool.execute(
        "UPDATE workspaces SET settings = $2 WHERE id = $1",
        workspace,
        {"ai": {"dictation_cleanup": {"context_tokens": 50}}},
    )
    parts = iter(range(1, 100))

    def note(_: Any) -> dict[str, Any]:
        part = next(parts)
        tasks = [{"what": f"oppgave {i}", "due": None} for i in range(2_500 * part)]
        return {"title": "Notat", "body": f"Del {part}.", "tasks": tasks}

    ai_gateway.answers["Note"] = note
    text = "diktert setning her\n" * 14  # 280 characters: two parts of at most 150
    job_id = await client.enqueue(pool, workspace, "dictation_cleanup", {"text": text})
    config = ServiceConfig({"AI_GATEWAY_URL": ai_gateway.url, "AI_GATEWAY_KEY": ai_gateway.key})
    job = await beside_noops(pool, db_url, workspace, job_id, config)
    assert job["status"] == "completed"
    result = await pool.fetchval("SELECT result FROM job_queue WHERE id = $1", job_id)
    assert result["parts"] == 2
    assert [t["what"] for t in result["note"]["tasks"]] == [f"oppgave {i}" for i in range(5_000)]


async def test_a_glob_of_repeated_double_stars_is_refused_beside_a_responsive_worker(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, tmp_path: Path
) -> None:
    # Each '**' walks every folder under the one the previous matched: in 30 nested folders,
    # five of them are 30^5/5! paths, seconds on the event loop (eight: hours).
    deep = tmp_path / str(workspace) / "logs"
    (deep / "/".join(["d"] * 30)).mkdir(parents=True)
    logs = "logs/" + "**/" * 5 + "*.log"
    job_id = await client.enqueue(pool, workspace, "stats_parse", {"logs": logs})
    await beside_noops(
        pool, db_url, workspace, job_id, ServiceConfig({"MEDIA_ROOT": str(tmp_path)})
    )
    assert await _error(pool, job_id) == (
        "error",
        1,
        f"logs {logs!r}: a glob takes '**' at most once, as a whole path segment",
    )
