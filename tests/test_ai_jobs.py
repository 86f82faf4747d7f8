"""The four AI job types end to end: a real worker, a real PostgreSQL and a real HTTP server
speaking the OpenRouter protocol. Happy paths, workspace settings, splitting, isolation."""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

import asyncpg
import pytest

from sidelinja_worker.jobs.ai.common import DEFAULT_MODEL
from sidelinja_worker.queue import client, store
from sidelinja_worker.queue.config import ServiceConfig
from tests.fakes.ai_gateway_server import FakeAiGateway, Recorded, ai_gateway_fixture  # noqa: F401
from tests.helpers import make_workspace, run_burst


def gateway_config(gw: FakeAiGateway) -> ServiceConfig:
    return ServiceConfig({"AI_GATEWAY_URL": gw.url, "AI_GATEWAY_KEY": gw.key})


async def run_jobs(pool: asyncpg.Pool, db_url: str, gw: FakeAiGateway) -> None:
    await run_burst(pool, db_url, config=gateway_config(gw))


async def job(pool: asyncpg.Pool, job_id: UUID) -> asyncpg.Record:
    row = await store.get_job(pool, job_id)
    assert row is not None
    return row


async def add_transcript(
    pool: asyncpg.Pool, workspace: UUID, ref: str, segments: list[tuple[int, str]]
) -> None:
    """A transcript as srt_parse stores it (migration 0006)."""
    plain = " ".join(text for _, text in segments)
    await pool.execute(
        "INSERT INTO transcripts (workspace_id, transcript_ref, language, source, plain_text,"
        " webvtt, segment_count, duration_ms) VALUES ($1, $2, 'no', $3, $4, 'WEBVTT', $5, $6)",
        workspace,
        ref,
        {"path": f"{ref}.srt"},
        plain,
        len(segments),
        segments[-1][0] + 1000,
    )
    await pool.executemany(
        "INSERT INTO transcript_segments (workspace_id, transcript_ref, seq, start_ms, end_ms, text)"
        " VALUES ($1, $2, $3, $4, $5, $6)",
        [
            (workspace, ref, i, start, start + 900, text)
            for i, (start, text) in enumerate(segments, 1)
        ],
    )


async def set_settings(pool: asyncpg.Pool, workspace: UUID, settings: dict[str, Any]) -> None:
    await pool.execute("UPDATE workspaces SET settings = $2 WHERE id = $1", workspace, settings)


async def stored(pool: asyncpg.Pool) -> list[asyncpg.Record]:
    return await pool.fetch(
        "SELECT workspace_id, kind, source_ref, model, result FROM ai_results"
        " ORDER BY kind, source_ref, workspace_id"
    )


async def test_analyze_a_stored_transcript(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, ai_gateway: FakeAiGateway
) -> None:
    await add_transcript(
        pool, workspace, "ep-1", [(0, "Hei og velkommen."), (95_000, "Nå om valget.")]
    )
    job_id = await client.enqueue(
        pool, workspace, "openrouter_analyze", {"transcript_ref": "ep-1", "title": "Valgspesial"}
    )
    await run_jobs(pool, db_url, ai_gateway)

    row = await job(pool, job_id)
    assert row["status"] == "completed", row["error_msg"]
    result = row["result"]
    assert result["analysis"]["chapters"][0] == {
        "start": "0:00:00",
        "title": "Innledning",
        "summary": "Vi starter.",
    }
    assert result["analysis"]["people"] == [{"name": "Kari Nordmann", "role": "ordfører"}]
    assert (result["model"], result["parts"], result["source_ref"]) == (DEFAULT_MODEL, 1, "ep-1")
    assert result["usage"] == {"prompt_tokens": 100, "completion_tokens": 20, "calls": 1}
    [req] = ai_gateway.chat_requests()
    assert req.headers["authorization"] == f"Bearer {ai_gateway.key}"
    assert req.body["provider"] == {"require_parameters": True}
    fmt = req.body["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["strict"] is True
    assert fmt["json_schema"]["name"] == "Analysis"
    # Segments go in with their times, so chapters can carry timestamps.
    assert "[0:00:00] Hei og velkommen.\n[0:01:35] Nå om valget." in req.message("user")
    assert "Episode: Valgspesial" in req.message("user")
    [saved] = await stored(pool)
    assert (saved["workspace_id"], saved["kind"], saved["source_ref"]) == (
        workspace,
        "openrouter_analyze",
        "ep-1",
    )
    assert saved["result"]["analysis"] == result["analysis"]


async def test_research_clip(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, ai_gateway: FakeAiGateway
) -> None:
    job_id = await client.enqueue(
        pool,
        workspace,
        "research_clip",
        {
            "text": "Meny | Logg inn\nRegjeringen lyser ut nye felt for havvind.",
            "source_url": "https://www.nrk.no/havvind",
            "ref": "clip-7",
        },
    )
    assert (await job(pool, job_id))["priority"] == 10
    await run_jobs(pool, db_url, ai_gateway)

    row = await job(pool, job_id)
    assert row["status"] == "completed", row["error_msg"]
    assert row["result"]["clip"]["entities"] == [{"name": "Equinor", "kind": "organisation"}]
    assert row["result"]["source_url"] == "https://www.nrk.no/havvind"
    [req] = ai_gateway.chat_requests()
    assert "Source: https://www.nrk.no/havvind" in req.message("user")
    assert "Regjeringen lyser ut" in req.message("user")
    assert [(r["kind"], r["source_ref"]) for r in await stored(pool)] == [
        ("research_clip", "clip-7")
    ]


async def test_dictation_cleanup_with_workspace_names_prompt_and_model(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, ai_gateway: FakeAiGateway
) -> None:
    await set_settings(
        pool,
        workspace,
        {
            "ai": {
                "model": "anthropic/claude-sonnet-4",
                "names": ["Kari Nordmann", "Tromsø"],
                "dictation_cleanup": {
                    "model": "google/gemini-2.5-flash",
                    "prompt": "Rydd opp i diktatet.",
                },
            }
        },
    )
    job_id = await client.enqueue(
        pool, workspace, "dictation_cleanup", {"text": "eh ring kari nordman i tromsø på fredag"}
    )
    await run_jobs(pool, db_url, ai_gateway)

    row = await job(pool, job_id)
    assert row["status"] == "completed", row["error_msg"]
    assert row["result"]["note"]["tasks"] == [{"what": "Ring Kari", "due": "fredag"}]
    assert row["result"]["source_ref"] == f"job:{job_id}"  # no ref given: keyed by the job
    [req] = ai_gateway.chat_requests()
    assert req.body["model"] == "google/gemini-2.5-flash"  # the job type's model wins
    system = req.message("system")
    assert system.startswith("Rydd opp i diktatet.")
    assert "- Kari Nordmann\n- Tromsø" in system


async def test_meeting_summarize(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, ai_gateway: FakeAiGateway
) -> None:
    await set_settings(pool, workspace, {"ai": {"model": "anthropic/claude-sonnet-4"}})
    await add_transcript(pool, workspace, "møte-3", [(0, "Ola booker studio til fredag.")])
    job_id = await client.enqueue(
        pool,
        workspace,
        "meeting_summarize",
        {"transcript_ref": "møte-3", "meeting_date": "2025-03-04", "participants": ["Ola", "Kari"]},
    )
    await run_jobs(pool, db_url, ai_gateway)

    row = await job(pool, job_id)
    assert row["status"] == "completed", row["error_msg"]
    assert row["result"]["minutes"]["action_points"] == [
        {"who": "Ola", "what": "Booke studio", "due": "2025-03-07"}
    ]
    [req] = ai_gateway.chat_requests()
    assert req.body["model"] == "anthropic/claude-sonnet-4"  # the workspace's model
    assert "Meeting date: 2025-03-04 (Tuesday)." in req.message("user")
    assert "Participants: Ola, Kari." in req.message("user")


def numbered_summary(request: Recorded) -> dict[str, Any]:
    """An Analysis whose summary names the lines it was shown (for the split test)."""
    shown = [line for line in request.message("user").splitlines() if "setning" in line]
    return {
        "title_suggestions": ["T"],
        "summary": f"{len(shown)} lines",
        "topics": [],
        "chapters": [{"start": shown[0][1:8] if shown else "0:00:00", "title": "K", "summary": ""}],
        "people": [],
    }


async def test_a_long_transcript_is_split_and_the_parts_combined(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, ai_gateway: FakeAiGateway
) -> None:
    await set_settings(pool, workspace, {"ai": {"context_tokens": 150}})  # 450 characters a part
    segments = [(i * 10_000, f"Dette er setning {i} om byvalget.") for i in range(60)]
    await add_transcript(pool, workspace, "lang", segments)
    ai_gateway.answers["Analysis"] = numbered_summary
    job_id = await client.enqueue(pool, workspace, "openrouter_analyze", {"transcript_ref": "lang"})
    await run_jobs(pool, db_url, ai_gateway)

    row = await job(pool, job_id)
    assert row["status"] == "completed", row["error_msg"]
    requests = ai_gateway.chat_requests()
    parts = [r for r in requests if "of one text. Answer for this part only." in r.message("user")]
    combines = [r for r in requests if "Partial answers for consecutive parts" in r.message("user")]
    assert row["result"]["parts"] == len(parts) > 1
    assert len(requests) == len(parts) + len(combines) and combines
    # Not cut: every line of the transcript went to exactly one part, in order.
    shown = [line for r in parts for line in r.message("user").splitlines() if "setning" in line]
    assert shown == [
        f"[{t // 3600}:{t % 3600 // 60:02d}:{t % 60:02d}] {text}"
        for t, text in ((ms // 1000, text) for ms, text in segments)
    ]
    assert all(len(r.message("user")) < 450 + 200 for r in parts)
    # The parts' answers reach the combine step, and its answer is the job's result.
    assert '"summary":"' in combines[0].message("user")
    assert row["result"]["usage"]["calls"] == len(requests)


MINUTES = {"summary": "Del.", "decisions": [], "action_points": []}
USAGE = {"prompt_tokens": 100, "completion_tokens": 20, "calls": 1}


@pytest.mark.parametrize(
    ("second", "says"),
    [
        ({"part": 2, "minutes": MINUTES, "usage": "mange"}, "usage: Input should be a valid"),
        ({"part": 2, "minutes": MINUTES, "usage": {"calls": "1"}}, "usage.calls: Input should"),
        ({"part": 2, "minutes": MINUTES, "usage": {"calls": -1}}, "usage.calls: Input should"),
        ({"part": 2, "minutes": "Referat.", "usage": USAGE}, "minutes: Input should be a valid"),
        ({"part": 2, "minutes": {"summary": 3}, "usage": USAGE}, "minutes.summary: Input should"),
        ({"part": "to", "minutes": MINUTES, "usage": USAGE}, "part: Input should be a valid"),
    ],
)
async def test_a_combine_job_fails_for_good_on_a_part_result_rewritten_by_sql(
    pool: asyncpg.Pool,
    db_url: str,
    workspace: UUID,
    ai_gateway: FakeAiGateway,
    second: dict[str, Any],
    says: str,
) -> None:
    # A map-reduce graph as plain SQL in the workspace can leave it: parts completed, one with
    # a result that is not what a part job writes. A retry would read the same result again.
    first = {"part": 1, "minutes": MINUTES, "usage": USAGE}
    join = await pool.fetchval(
        "WITH parts AS ("
        "  INSERT INTO job_queue (workspace_id, job_type, payload, status, result)"
        "  SELECT $1, 'meeting_summarize', '{}', 'completed', r FROM unnest($2::jsonb[]) AS r"
        "  RETURNING id"
        "), j AS ("
        "  INSERT INTO job_queue (workspace_id, job_type, payload)"
        '  VALUES ($1, \'meeting_summarize\', \'{"text": "Møtet.", "combine": true}\')'
        "  RETURNING id"
        "), edges AS ("
        "  INSERT INTO job_dependencies (parent_id, child_id) SELECT parts.id, j.id FROM parts, j"
        ") SELECT id FROM j",
        workspace,
        [first, second],
    )
    await run_jobs(pool, db_url, ai_gateway)
    row = await job(pool, join)
    assert (row["status"], row["attempts"]) == ("error", 1), row["error_msg"]
    assert row["error_msg"].startswith("a part job's result is not what a part job writes")
    assert says in row["error_msg"]
    assert ai_gateway.requests == []  # nothing is paid for before the parts are read


async def test_a_long_dictation_is_joined_without_a_combine_call(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, ai_gateway: FakeAiGateway
) -> None:
    await set_settings(pool, workspace, {"ai": {"dictation_cleanup": {"context_tokens": 100}}})
    bodies = iter(f"Del {i}." for i in range(1, 100))
    ai_gateway.answers["Note"] = lambda r: {"title": "Notat", "body": next(bodies), "tasks": []}
    text = "\n".join(f"diktert setning nummer {i} her" for i in range(40))
    job_id = await client.enqueue(pool, workspace, "dictation_cleanup", {"text": text})
    await run_jobs(pool, db_url, ai_gateway)

    row = await job(pool, job_id)
    assert row["status"] == "completed", row["error_msg"]
    calls = len(ai_gateway.chat_requests())
    assert calls == row["result"]["parts"] > 1
    assert row["result"]["note"]["body"] == "\n\n".join(f"Del {i}." for i in range(1, calls + 1))


async def test_a_job_reads_and_writes_only_its_own_workspace(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, ai_gateway: FakeAiGateway
) -> None:
    other = await make_workspace(pool, "other")
    await add_transcript(pool, other, "ep-b", [(0, "Hemmelig innhold i B.")])
    await add_transcript(pool, workspace, "felles", [(0, "Innhold i A.")])
    await add_transcript(pool, other, "felles", [(0, "Innhold i B.")])
    ai_gateway.answers["Analysis"] = lambda r: {
        "title_suggestions": [r.message("user").strip()],
        "summary": "s",
        "chapters": [],
        "topics": [],
        "people": [],
    }
    steal = await client.enqueue(pool, workspace, "openrouter_analyze", {"transcript_ref": "ep-b"})
    in_a = await client.enqueue(pool, workspace, "openrouter_analyze", {"transcript_ref": "felles"})
    in_b = await client.enqueue(pool, other, "openrouter_analyze", {"transcript_ref": "felles"})
    await run_jobs(pool, db_url, ai_gateway)

    row = await job(pool, steal)
    assert (row["status"], row["error_msg"]) == (
        "error",
        "transcript 'ep-b' not found in this workspace",
    )
    assert all("Hemmelig" not in r.text() for r in ai_gateway.requests)
    rows = {r["workspace_id"]: r for r in await stored(pool)}
    assert set(rows) == {workspace, other}
    assert rows[workspace]["result"]["analysis"]["title_suggestions"] == ["[0:00:00] Innhold i A."]
    assert rows[other]["result"]["analysis"]["title_suggestions"] == ["[0:00:00] Innhold i B."]
    assert (await job(pool, in_a))["result"]["ai_result_id"] != (await job(pool, in_b))["result"][
        "ai_result_id"
    ]


async def test_a_rerun_replaces_the_stored_answer(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, ai_gateway: FakeAiGateway
) -> None:
    for summary in ("første", "andre"):
        ai_gateway.answers["Minutes"] = lambda r, s=summary: {
            "summary": s,
            "decisions": [],
            "action_points": [],
        }
        await client.enqueue(pool, workspace, "meeting_summarize", {"text": "møte", "ref": "m1"})
        await run_jobs(pool, db_url, ai_gateway)
    [saved] = await stored(pool)
    assert saved["result"]["minutes"]["summary"] == "andre"


async def test_bad_input_fails_at_once_without_a_call(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, ai_gateway: FakeAiGateway
) -> None:
    both = await client.enqueue(
        pool, workspace, "dictation_cleanup", {"transcript_ref": "a", "text": "b"}
    )
    bad_url = await client.enqueue(
        pool, workspace, "research_clip", {"text": "x", "source_url": "nope"}
    )
    missing = await client.enqueue(
        pool, workspace, "openrouter_analyze", {"transcript_ref": "finnes-ikke"}
    )
    await set_settings(pool, workspace, {"ai": {"names": "Kari"}})  # must be a list
    bad_settings = await client.enqueue(pool, workspace, "meeting_summarize", {"text": "møte"})
    await run_jobs(pool, db_url, ai_gateway)

    errors = {
        k: await job(pool, v)
        for k, v in {
            "both": both,
            "bad_url": bad_url,
            "missing": missing,
            "settings": bad_settings,
        }.items()
    }
    assert all((r["status"], r["attempts"]) == ("error", 1) for r in errors.values())
    assert "exactly one of transcript_ref or text" in errors["both"]["error_msg"]
    assert errors["bad_url"]["error_msg"].startswith("invalid payload: source_url")
    assert "not found in this workspace" in errors["missing"]["error_msg"]
    assert errors["settings"]["error_msg"].startswith("workspace settings ai: names")
    assert ai_gateway.requests == []


async def test_unset_gateway_settings_fail_naming_the_variable(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    job_id = await client.enqueue(pool, workspace, "research_clip", {"text": "x"})
    await run_burst(pool, db_url)  # no outside services configured
    row = await job(pool, job_id)
    assert row["status"] == "error"
    assert "AI_GATEWAY_URL, AI_GATEWAY_KEY not set" in row["error_msg"]


def test_payload_round_trips_through_json() -> None:
    from sidelinja_worker.jobs.ai.meeting_summarize import MeetingPayload

    payload = MeetingPayload.model_validate(
        json.loads(json.dumps({"text": "t", "meeting_date": "2025-03-04", "participants": ["Ola"]}))
    )
    assert MeetingPayload.model_validate_json(payload.model_dump_json()) == payload
