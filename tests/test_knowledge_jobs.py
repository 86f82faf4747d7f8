"""valgomat_generate_profile, valgomat_moderation and prompt_eval end to end on the test
PostgreSQL (DATABASE_URL's, which may lack pgvector: the migration must pass there, or the
embedded one, which has it), with a real worker and the fake OpenRouter gateway; and
generate_embeddings failing clearly without pgvector."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import pydantic
import pytest

from sidelinja_worker.jobs.knowledge import valgomat_generate_profile
from sidelinja_worker.jobs.knowledge.common import DEFAULT_EMBEDDING_MODEL
from sidelinja_worker.jobs.knowledge.prompt_eval_scoring import (
    MAX_SCHEMA_STEPS,
    MAX_SEARCH_CHARS,
    JsonSchemaCheck,
    RegexCheck,
    schema_errors,
    score,
)
from sidelinja_worker.queue import client, store
from sidelinja_worker.queue.config import ServiceConfig
from sidelinja_worker.queue.errors import PermanentError
from tests.fakes.ai_gateway_server import (  # noqa: F401
    FakeAiGateway,
    Recorded,
    ai_gateway_fixture,
    completion,
    error,
)
from tests.fakes.fixtures import allow_models
from tests.fakes.stalls import longest_stall, peak_memory
from tests.helpers import make_workspace, run_burst, running_worker, wait_for_sql

STATEMENTS = [
    {"id": "s1", "text": "Norge bør bygge mer havvind."},
    {"id": "s2", "text": "Formuesskatten bør fjernes."},
]
PROGRAMME = "Vi vil satse kraftig på havvind i Nordsjøen.\nFormuesskatten skal bestå."


def config(gw: FakeAiGateway, **more: str) -> ServiceConfig:
    return ServiceConfig({"AI_GATEWAY_URL": gw.url, "AI_GATEWAY_KEY": gw.key, **more})


async def job(pool: asyncpg.Pool, job_id: UUID) -> asyncpg.Record:
    row = await store.get_job(pool, job_id)
    assert row is not None
    return row


async def other_workspace(pool: asyncpg.Pool) -> UUID:
    return await make_workspace(pool, "other")


def profile_answer(r: Recorded) -> dict[str, Any]:
    return {
        "summary": "Grønt og rettferdig.",
        "positions": [
            {
                "statement_id": "s1",
                "position": 2,
                "justification": "Programmet vil satse på havvind.",
                "quote": "Vi vil satse  kraftig på havvind",
            },
            {
                "statement_id": "s2",
                "position": -2,
                "justification": "Skatten skal bestå.",
                "quote": "Formuesskatten skal avskaffes",
            },
        ],
    }


async def test_embeddings_without_pgvector_fail_permanently_naming_it(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, ai_gateway: FakeAiGateway
) -> None:
    available = await pool.fetchval(
        "SELECT count(*) > 0 FROM pg_available_extensions WHERE name = 'vector'"
    )
    table = await pool.fetchval("SELECT to_regclass('knowledge_embeddings') IS NOT NULL")
    assert table == available  # migration 0010 makes the table exactly where pgvector exists
    # On a server with pgvector (the embedded one), this test's own database is made to look
    # like one without it: the table is what the job checks.
    await pool.execute("DROP TABLE IF EXISTS knowledge_embeddings")
    job_id = await client.enqueue(
        pool, workspace, "generate_embeddings", {"items": [{"ref": "a", "text": "tekst"}]}
    )
    await run_burst(pool, db_url, config=config(ai_gateway))
    row = await job(pool, job_id)
    assert (row["status"], row["attempts"]) == ("error", 1)
    assert row["error_msg"].startswith("generate_embeddings needs the pgvector extension")
    assert ai_gateway.requests == []


async def test_profile_from_a_programme_file(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, ai_gateway: FakeAiGateway, tmp_path: Path
) -> None:
    (tmp_path / str(workspace)).mkdir()  # the workspace's media folder
    (tmp_path / str(workspace) / "ap.txt").write_text(PROGRAMME, encoding="utf-8")
    ai_gateway.answers["Profile"] = profile_answer
    job_id = await client.enqueue(
        pool,
        workspace,
        "valgomat_generate_profile",
        {
            "quiz_id": "storting-2025",
            "party": "Testpartiet",
            "programme_path": "ap.txt",
            "statements": STATEMENTS,
        },
    )
    await run_burst(pool, db_url, config=config(ai_gateway, MEDIA_ROOT=str(tmp_path)))

    row = await job(pool, job_id)
    assert row["status"] == "completed", row["error_msg"]
    positions = row["result"]["profile"]["positions"]
    assert [(p["statement_id"], p["position"], p["quote_found"]) for p in positions] == [
        ("s1", 2, True),
        ("s2", -2, False),
    ]  # the second quote is not in the programme
    [req] = ai_gateway.chat_requests()
    assert req.body["response_format"]["json_schema"]["name"] == "Profile"
    assert "- [s1] Norge bør bygge mer havvind." in req.message("user")
    assert "Formuesskatten skal bestå." in req.message("user")
    saved = await pool.fetchrow(
        "SELECT workspace_id, quiz_id, party, profile FROM valgomat_profiles"
    )
    assert (saved["workspace_id"], saved["quiz_id"], saved["party"]) == (
        workspace,
        "storting-2025",
        "Testpartiet",
    )
    assert saved["profile"]["positions"] == positions


async def test_a_programme_hard_linked_from_another_workspace_is_never_read(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, ai_gateway: FakeAiGateway, tmp_path: Path
) -> None:
    # The programme was read by name after its path was checked: a hard link in this
    # workspace's folder (another workspace's file under a second name) was read and sent to
    # the AI gateway.
    other = await other_workspace(pool)
    (tmp_path / str(workspace)).mkdir()
    (tmp_path / str(other)).mkdir()
    (tmp_path / str(other) / "secret.txt").write_text(PROGRAMME, encoding="utf-8")
    os.link(tmp_path / str(other) / "secret.txt", tmp_path / str(workspace) / "ap.txt")
    ai_gateway.answers["Profile"] = profile_answer
    job_id = await client.enqueue(
        pool,
        workspace,
        "valgomat_generate_profile",
        {"quiz_id": "q", "party": "P", "programme_path": "ap.txt", "statements": STATEMENTS},
    )
    await run_burst(pool, db_url, config=config(ai_gateway, MEDIA_ROOT=str(tmp_path)))

    row = await job(pool, job_id)
    assert (row["status"], row["attempts"], row["error_msg"]) == (
        "error",
        1,
        "file 'ap.txt' has 2 links: a hard link may be another workspace's file, refused",
    )
    assert not ai_gateway.chat_requests()


@pytest.mark.parametrize(
    "content, words",
    [
        (b"x" * 101, "programme 'p.txt' is over 100 bytes"),
        (b"Program \xff", "programme 'p.txt' is not UTF-8 text"),
    ],
)
def test_a_programme_too_long_or_not_utf8_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: bytes, words: str
) -> None:
    monkeypatch.setattr(valgomat_generate_profile, "MAX_PROGRAMME_BYTES", 100)
    workspace = uuid4()
    (tmp_path / str(workspace)).mkdir()
    (tmp_path / str(workspace) / "p.txt").write_bytes(content)
    with pytest.raises(PermanentError) as raised:
        valgomat_generate_profile.read_programme(str(tmp_path), workspace, "p.txt")
    assert str(raised.value).startswith(words)


async def test_profile_bad_input_and_a_model_that_skips_statements(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, ai_gateway: FakeAiGateway, tmp_path: Path
) -> None:
    (tmp_path / str(workspace)).mkdir()  # the workspace's media folder
    outside = await client.enqueue(
        pool,
        workspace,
        "valgomat_generate_profile",
        {
            "quiz_id": "q",
            "party": "P",
            "programme_path": "../../etc/passwd",
            "statements": STATEMENTS,
        },
    )
    dupes = await client.enqueue(
        pool,
        workspace,
        "valgomat_generate_profile",
        {"quiz_id": "q", "party": "P", "programme_text": "x", "statements": STATEMENTS * 2},
    )
    ai_gateway.answers["Profile"] = lambda r: {"summary": "s", "positions": []}
    partial = await client.enqueue(
        pool,
        workspace,
        "valgomat_generate_profile",
        {"quiz_id": "q", "party": "P", "programme_text": PROGRAMME, "statements": STATEMENTS},
    )
    await run_burst(pool, db_url, config=config(ai_gateway, MEDIA_ROOT=str(tmp_path)))

    assert (await job(pool, outside))["error_msg"] == (
        f"path '../../etc/passwd' is outside this workspace's media folder (MEDIA_ROOT/{workspace})"
    )
    assert "statement ids must be unique" in (await job(pool, dupes))["error_msg"]
    row = await job(pool, partial)
    assert row["status"] == "retry"
    assert row["error_msg"] == "the model's profile left out 2 statement(s): s1, s2"
    assert await pool.fetchval("SELECT count(*) FROM valgomat_profiles") == 0


async def test_checking_the_quotes_of_a_long_programme_does_not_stall_the_event_loop(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, ai_gateway: FakeAiGateway, tmp_path: Path
) -> None:
    """Checking the quotes squashes the whole programme and searches it once per statement:
    1.1 s for a 17 MB programme and 200 statements, 0.5 s for one of 4.5 MB. On the event loop
    it held every other job of the worker, its heartbeat and its timeouts; it runs in a
    thread, a piece at a time, as str.split and str.casefold hold the GIL for all of the string
    they are given (a thread alone left steps of up to 0.24 s for 4.5 MB). This programme is
    9 MB, so that the bound stands clear of both and of a slow hour's steps (0.2 s seen)."""
    (tmp_path / str(workspace)).mkdir()  # the workspace's media folder
    line = "Vi vil satse kraftig på havvind i Nordsjøen, og formuesskatten skal bestå.\n"
    (tmp_path / str(workspace) / "long.txt").write_text(line * 120_000, encoding="utf-8")
    # Parts of 300,000 characters: each request to the gateway is then a light step.
    await pool.execute(
        "UPDATE workspaces SET settings = $2 WHERE id = $1",
        workspace,
        {"ai": {"context_tokens": 100_000}},
    )
    statements = [{"id": f"s{i}", "text": f"Påstand {i}"} for i in range(200)]
    ai_gateway.answers["Profile"] = lambda r: {
        "summary": "Grønt.",
        "positions": [
            {
                "statement_id": s["id"],
                "position": 1,
                "justification": "Programmet sier det.",
                "quote": "satse  kraftig på HAVVIND" if s["id"] == "s0" else f"ikke der {s['id']}",
            }
            for s in statements
        ],
    }
    payload = {"quiz_id": "q", "party": "P", "statements": statements}
    ended = "SELECT status IN ('completed', 'error') FROM job_queue WHERE id = $1"
    services = config(ai_gateway, MEDIA_ROOT=str(tmp_path))
    async with running_worker(pool, db_url, config=services, poll_interval_s=0.05):
        # A short programme first: a worker makes its HTTP client (and imports modules) on its
        # first call, on the loop, whatever the job.
        first = await client.enqueue(
            pool, workspace, "valgomat_generate_profile", {**payload, "programme_text": PROGRAMME}
        )
        await wait_for_sql(pool, ended, first)
        with longest_stall() as stall:
            job_id = await client.enqueue(
                pool,
                workspace,
                "valgomat_generate_profile",
                {**payload, "programme_path": "long.txt"},
            )
            await wait_for_sql(pool, ended, job_id)
    row = await job(pool, job_id)
    assert row["status"] == "completed", row["error_msg"]
    found = [p["quote_found"] for p in row["result"]["profile"]["positions"]]
    assert found == [True] + [False] * 199
    assert stall[0] < 0.3, stall[0]


@pytest.mark.parametrize(
    "text",
    ["", " ", "a b", "ab", " a\u00a0\u2003b ", "Straße  İ ΣΑΣ", "a" * 10, "ab  cd\nef g", "\n\n a"],
)
def test_a_text_squashed_in_pieces_is_the_text_squashed_whole(
    text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Pieces of three characters: words and runs of whitespace cut by a piece's end.
    monkeypatch.setattr(valgomat_generate_profile, "SQUASH_PIECE_CHARS", 3)
    assert valgomat_generate_profile._squash(text) == " ".join(text.split()).casefold()


def topic_vector(text: str, dims: int) -> list[float]:
    words = ["havvind", "skatt", "skole", "bompenger"]
    return [1.0 if w in text.lower() else 0.0 for w in words] + [len(text) / 100]


async def add_questions(
    pool: asyncpg.Pool, workspace: UUID, quiz: str, questions: dict[str, str]
) -> None:
    await pool.executemany(
        "INSERT INTO valgomat_questions (workspace_id, quiz_id, question_id, text) VALUES ($1, $2, $3, $4)",
        [(workspace, quiz, k, v) for k, v in questions.items()],
    )


def review(r: Recorded) -> dict[str, Any]:
    return {
        "neutral_question": "Bør Norge bygge mer havvind?",
        "leading": True,
        "loaded_terms": ["naturødeleggende"],
        "flags": ["leading", "loaded_language"],
        "explanation": "Spørsmålet antyder et svar.",
    }


async def test_moderation_finds_the_duplicate_in_the_same_quiz_only(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, ai_gateway: FakeAiGateway
) -> None:
    other = await other_workspace(pool)
    ai_gateway.vector = topic_vector
    ai_gateway.answers["Review"] = review
    await add_questions(
        pool,
        workspace,
        "q1",
        {"q-vind": "Bør det bygges mer havvind?", "q-skatt": "Bør skatten ned?"},
    )
    await add_questions(pool, workspace, "q2", {"q2-vind": "Havvind overalt?"})
    await add_questions(pool, other, "q1", {"b-vind": "Havvind i B?"})
    question = "Er du ikke enig i at naturødeleggende havvind må stoppes?"
    job_id = await client.enqueue(
        pool,
        workspace,
        "valgomat_moderation",
        {"quiz_id": "q1", "question": question, "submission_ref": "sub-1"},
    )
    await run_burst(pool, db_url, config=config(ai_gateway))

    row = await job(pool, job_id)
    assert row["status"] == "completed", row["error_msg"]
    result = row["result"]
    assert (result["duplicate_of"], result["status"], result["threshold"]) == (
        "q-vind",
        "pending",
        0.9,
    )
    assert [c["question_id"] for c in result["similar"]] == ["q-vind", "q-skatt"]
    assert result["review"]["flags"] == ["leading", "loaded_language"]
    [emb] = [r for r in ai_gateway.requests if r.path.endswith("/embeddings")]
    assert emb.body["input"] == [question, "Bør skatten ned?", "Bør det bygges mer havvind?"]
    saved = await pool.fetchrow("SELECT * FROM valgomat_moderation")
    assert (saved["workspace_id"], saved["duplicate_of"], saved["status"]) == (
        workspace,
        "q-vind",
        "pending",
    )
    assert saved["rewrite"] == "Bør Norge bygge mer havvind?"
    assert saved["flags"] == ["leading", "loaded_language"]
    # The quiz's vectors were stored; B's question and the other quiz's were never touched.
    vectors = await pool.fetch(
        "SELECT question_id FROM valgomat_questions WHERE embedding IS NOT NULL"
    )
    assert sorted(r[0] for r in vectors) == ["q-skatt", "q-vind"]

    # A stricter threshold, a second submission: the stored vectors are reused, no duplicate.
    await pool.execute(
        "UPDATE workspaces SET settings = $2 WHERE id = $1",
        workspace,
        {"valgomat": {"duplicate_threshold": 0.999}},
    )
    again = await client.enqueue(
        pool,
        workspace,
        "valgomat_moderation",
        {"quiz_id": "q1", "question": question, "submission_ref": "sub-2"},
    )
    await run_burst(pool, db_url, config=config(ai_gateway))
    result = (await job(pool, again))["result"]
    assert result["duplicate_of"] is None and result["similarity"] < 0.999
    last = [r for r in ai_gateway.requests if r.path.endswith("/embeddings")][-1]
    assert last.body["input"] == [question]


@pytest.mark.parametrize(
    "poisoned",
    ["{NaN,1,0,0,0.3}", "{1,0,0,0,Infinity}", "{-Infinity,1,0,0,0.3}", "{1,NULL,0,0,0.3}", "{}"],
)
async def test_a_stored_question_vector_that_is_not_finite_is_embedded_again(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, ai_gateway: FakeAiGateway, poisoned: str
) -> None:
    # A vector stored by plain SQL (or by a worker that took the gateway's NaN) under the
    # question's current hash and model: only its values say that it is stale.
    ai_gateway.vector = topic_vector
    ai_gateway.answers["Review"] = review
    await add_questions(
        pool,
        workspace,
        "q1",
        {"q-vind": "Bør det bygges mer havvind?", "q-skatt": "Bør skatten ned?"},
    )
    await pool.execute(
        "UPDATE valgomat_questions SET embedding = $2::text::real[], embedding_model = $3,"
        " embedding_sha256 = sha256(convert_to(text, 'UTF8'))"
        " WHERE workspace_id = $1 AND question_id = 'q-vind'",
        workspace,
        poisoned,
        DEFAULT_EMBEDDING_MODEL,
    )
    question = "Er du ikke enig i at naturødeleggende havvind må stoppes?"
    job_id = await client.enqueue(
        pool, workspace, "valgomat_moderation", {"quiz_id": "q1", "question": question}
    )
    await run_burst(pool, db_url, config=config(ai_gateway))

    row = await job(pool, job_id)
    assert row["status"] == "completed", row["error_msg"]
    assert row["result"]["duplicate_of"] == "q-vind"
    [emb] = [r for r in ai_gateway.requests if r.path.endswith("/embeddings")]
    assert "Bør det bygges mer havvind?" in emb.body["input"]
    stored = await pool.fetchval(
        "SELECT embedding FROM valgomat_questions WHERE question_id = 'q-vind'"
    )
    assert stored == pytest.approx(topic_vector("Bør det bygges mer havvind?", 5))


async def test_ranking_a_big_quiz_does_not_stall_the_event_loop(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, ai_gateway: FakeAiGateway
) -> None:
    # The submission's cosine with each stored question is Python arithmetic: 1,000 questions
    # of 3,072 numbers held the event loop a second. Here 1,000 of 1,536, 0.3 s on the loop.
    dims = 1536
    await pool.execute(
        "UPDATE workspaces SET settings = $2 WHERE id = $1",
        workspace,
        {"ai": {"embeddings": {"dimensions": dims}}},
    )
    texts = [f"Bør kommunen gjøre tiltak nummer {i}?" for i in range(1000)]
    await pool.executemany(
        "INSERT INTO valgomat_questions (workspace_id, quiz_id, question_id, text,"
        " embedding_model, embedding_sha256, embedding) VALUES ($1, 'q1', $2, $3, $4,"
        " sha256(convert_to($3, 'UTF8')), array_fill(0.5::real, ARRAY[$5::int]))",
        [(workspace, f"q{i}", t, DEFAULT_EMBEDDING_MODEL, dims) for i, t in enumerate(texts)],
    )
    ai_gateway.answers["Review"] = review
    job_id = await client.enqueue(
        pool, workspace, "valgomat_moderation", {"quiz_id": "q1", "question": "Havvind?"}
    )
    with longest_stall() as stall:
        await run_burst(pool, db_url, config=config(ai_gateway))
    row = await job(pool, job_id)
    assert row["status"] == "completed", row["error_msg"]
    assert (len(row["result"]["similar"]), stall[0] < 0.15) == (3, True), stall


async def test_a_decided_review_is_not_overwritten(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, ai_gateway: FakeAiGateway
) -> None:
    ai_gateway.answers["Review"] = review
    payload = {"quiz_id": "q1", "question": "Havvind?", "submission_ref": "sub-1"}
    await client.enqueue(pool, workspace, "valgomat_moderation", payload)
    await run_burst(pool, db_url, config=config(ai_gateway))
    await pool.execute("UPDATE valgomat_moderation SET status = 'approved', rewrite = 'Godkjent?'")
    rerun = await client.enqueue(pool, workspace, "valgomat_moderation", payload)
    await run_burst(pool, db_url, config=config(ai_gateway))
    assert (await job(pool, rerun))["result"]["status"] == "approved"
    assert await pool.fetchval("SELECT rewrite FROM valgomat_moderation") == "Godkjent?"


EVAL_CASES = [
    {
        "id": "hovedstad",
        "inputs": {"land": "Norge"},
        "expect": [
            {"kind": "exact", "value": "oslo", "ignore_case": True},
            {"kind": "judge", "criteria": "Names the capital."},
        ],
    },
    {
        "id": "tall",
        "inputs": {"land": "Sverige"},
        "expect": [
            {"kind": "numeric", "value": 10.5, "tolerance": 0.1},
            {"kind": "regex", "pattern": r"\d+,\d"},
        ],
    },
    {
        "id": "json",
        "inputs": {"land": "Danmark"},
        "expect": [
            {
                "kind": "json_schema",
                "schema": {
                    "type": "object",
                    "required": ["by"],
                    "properties": {"by": {"type": "string"}},
                },
            },
            {"kind": "contains", "value": "København"},
        ],
    },
]


def eval_answer(r: Recorded) -> str:
    text = r.message("user")
    if "Norge" in text:
        return "Oslo"
    if "Sverige" in text:
        return "Omtrent 10,5 millioner" if r.body["model"] == "good/model" else "Ca. 11 millioner"
    return '{"by": "København"}'


async def test_prompt_eval_scores_every_case_per_model(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, ai_gateway: FakeAiGateway
) -> None:
    ai_gateway.plain_answer = eval_answer
    ai_gateway.answers["Verdict"] = lambda r: {
        "passed": "Oslo" in r.message("user"),
        "reason": "ok",
    }

    def refuse(r: Recorded) -> Any:
        if r.body["model"] == "bad/model" and "Danmark" in r.message("user"):
            return error(400, "refused")
        return eval_answer_reply(r)

    await allow_models(pool, workspace, "good/model", "bad/model", "judge/model")
    ai_gateway.push(*[refuse] * 9)  # 6 answers and 3 verdicts
    job_id = await client.enqueue(
        pool,
        workspace,
        "prompt_eval",
        {
            "prompt": "Hovedstaden eller folketallet i {{land}}?",
            "system": "Svar kort.",
            "cases": EVAL_CASES,
            "models": ["good/model", "bad/model"],
            "max_concurrency": 2,
            "judge_model": "judge/model",
            "ref": "lab-1",
        },
    )
    assert (await job(pool, job_id))["priority"] == 1
    await run_burst(pool, db_url, config=config(ai_gateway))

    # A case per job, then one scoring job after all of them.
    parent = await job(pool, job_id)
    assert parent["status"] == "completed", parent["error_msg"]
    assert parent["result"]["cases"] == 3
    cases = await pool.fetch(
        "SELECT j.* FROM job_queue j JOIN job_dependencies d ON d.child_id = j.id"
        " WHERE d.parent_id = $1 AND j.job_type = 'prompt_eval_case'",
        job_id,
    )
    assert len(cases) == 3 and {c["status"] for c in cases} == {"completed"}
    assert sorted(c["payload"]["cases"][0]["id"] for c in cases) == ["hovedstad", "json", "tall"]
    assert all(c["priority"] == 1 for c in cases)
    scorers = await pool.fetch("SELECT * FROM job_queue WHERE job_type = 'prompt_eval_score'")
    assert len(scorers) == 1 and str(scorers[0]["id"]) == parent["result"]["score_job"]
    row = scorers[0]
    assert row["status"] == "completed", row["error_msg"]
    assert row["attempts"] == 1
    assert row["started_at"] >= max(c["completed_at"] for c in cases)
    summary = row["result"]["summary"]
    assert (summary["good/model"]["passed"], summary["good/model"]["failed"]) == (3, 0)
    assert summary["good/model"]["prompt_tokens"] == 300
    assert summary["bad/model"]["cases"] == 3
    assert (row["progress"]["message"], row["progress"]["percent"]) == ("Prompt-lab: 6/6 svar", 100)
    results = {
        (r["model"], r["case_id"]): r
        for r in await pool.fetch(
            "SELECT * FROM prompt_eval_results WHERE workspace_id = $1", workspace
        )
    }
    assert len(results) == 6
    tall = results[("bad/model", "tall")]
    assert not tall["passed"] and [s["passed"] for s in tall["scores"]] == [False, False]
    assert tall["latency_ms"] is not None and tall["completion_tokens"] == 20
    assert results[("bad/model", "json")]["error"] == "AI gateway 400: refused"
    assert summary["bad/model"]["errors"] == 1
    judged = results[("good/model", "hovedstad")]["scores"]
    assert [(s["kind"], s["passed"]) for s in judged] == [("exact", True), ("judge", True)]
    chats = ai_gateway.chat_requests()
    assert all(c.body.get("temperature") == 0 for c in chats if c.schema_name is None)
    judge_calls = [c for c in chats if c.schema_name == "Verdict"]
    assert {c.body["model"] for c in judge_calls} == {"judge/model"}
    run = await pool.fetchrow("SELECT run_ref, job_id, summary FROM prompt_eval_runs")
    assert run["run_ref"] == "lab-1" and run["summary"]["models"] == summary
    assert run["job_id"] == job_id
    assert row["result"]["judge_usage"]["calls"] == 2  # the one judge check, per model


def eval_answer_reply(r: Recorded) -> Any:
    if r.schema_name == "Verdict":
        return completion(
            {"passed": "Oslo" in r.message("user"), "reason": "ok"}, model=r.body["model"]
        )
    return completion(eval_answer(r), model=r.body["model"])


async def test_prompt_eval_case_refused_is_recorded_and_an_outage_retries(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, ai_gateway: FakeAiGateway
) -> None:
    ai_gateway.plain_answer = eval_answer
    cases = [c for c in EVAL_CASES if c["id"] != "hovedstad"]

    def refuse_danmark(r: Recorded) -> Any:
        return (
            error(403, "flagged", {"reasons": ["test"]})
            if "Danmark" in r.message("user")
            else eval_answer_reply(r)
        )

    await allow_models(pool, workspace, "good/model")
    ai_gateway.push(refuse_danmark, refuse_danmark)
    ok = await client.enqueue(
        pool,
        workspace,
        "prompt_eval",
        {"prompt": "{{land}}", "cases": cases, "models": ["good/model"], "max_concurrency": 1},
    )
    await run_burst(pool, db_url, config=config(ai_gateway))
    row = await score_job(pool, ok)
    assert row["status"] == "completed", row["error_msg"]
    assert row["result"]["summary"]["good/model"]["errors"] == 1
    err = await pool.fetchval("SELECT error FROM prompt_eval_results WHERE case_id = 'json'")
    assert err.startswith("AI gateway 403: flagged")

    ai_gateway.push(*[error(502, "Provider down", {"provider_name": "X"})] * 2)  # once per case
    down = await client.enqueue(
        pool,
        workspace,
        "prompt_eval",
        {"prompt": "{{land}}", "cases": cases, "models": ["good/model"], "ref": "down"},
    )
    await run_burst(pool, db_url, config=config(ai_gateway))
    # The outage retries the case jobs, each alone; the scoring waits for them.
    assert (await job(pool, down))["status"] == "completed"
    case_jobs = await case_jobs_of(pool, down)
    assert [c["status"] for c in case_jobs] == ["retry", "retry"]
    assert all("AI gateway 502" in c["error_msg"] for c in case_jobs)
    assert (await score_job(pool, down))["status"] == "waiting"
    assert await pool.fetchval("SELECT count(*) FROM prompt_eval_runs WHERE run_ref = 'down'") == 0

    # One case job fails for good (its attempts used up); the other succeeds on its retry. The
    # scoring runs anyway, and records the failed case's model as an error naming its job.
    failed, retried = case_jobs
    await pool.execute(
        "UPDATE job_queue SET status = 'error', completed_at = now() WHERE id = $1", failed["id"]
    )
    await pool.execute("UPDATE job_queue SET scheduled_for = now() WHERE id = $1", retried["id"])
    await run_burst(pool, db_url, config=config(ai_gateway))
    row = await score_job(pool, down)
    assert row["status"] == "completed", row["error_msg"]
    assert row["result"]["summary"]["good/model"]["errors"] == 1
    results = {
        r["case_id"]: r
        for r in await pool.fetch(
            "SELECT r.* FROM prompt_eval_results r JOIN prompt_eval_runs u ON u.id = r.run_id"
            " WHERE u.run_ref = 'down'"
        )
    }
    lost = failed["payload"]["cases"][0]["id"]
    assert results[lost]["error"] == f"case job {failed['id']} ended in error"
    assert results[retried["payload"]["cases"][0]["id"]]["error"] is None


async def case_jobs_of(pool: asyncpg.Pool, run: UUID) -> list[asyncpg.Record]:
    return await pool.fetch(
        "SELECT j.* FROM job_queue j JOIN job_dependencies d ON d.child_id = j.id"
        " WHERE d.parent_id = $1 AND j.job_type = 'prompt_eval_case' ORDER BY j.id",
        run,
    )


async def score_job(pool: asyncpg.Pool, run: UUID) -> asyncpg.Record:
    return await pool.fetchrow(
        "SELECT j.*, j.status::text AS status FROM job_queue j"
        " JOIN job_dependencies d ON d.child_id = j.id"
        " WHERE d.parent_id = $1 AND j.job_type = 'prompt_eval_score'",
        run,
    )


async def test_prompt_eval_bad_input(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, ai_gateway: FakeAiGateway
) -> None:
    missing_input = await client.enqueue(
        pool,
        workspace,
        "prompt_eval",
        {
            "prompt": "{{land}} {{by}}",
            "cases": [{"id": "a", "inputs": {"land": "x"}}],
            "models": ["m"],
        },
    )
    bad_regex = await client.enqueue(
        pool,
        workspace,
        "prompt_eval",
        {
            "prompt": "p",
            "cases": [{"id": "a", "expect": [{"kind": "regex", "pattern": "("}]}],
            "models": ["m"],
        },
    )
    no_judge = await client.enqueue(
        pool,
        workspace,
        "prompt_eval",
        {
            "prompt": "p",
            "cases": [{"id": "a", "expect": [{"kind": "judge", "criteria": "c"}]}],
            "models": ["m"],
        },
    )
    await run_burst(pool, db_url, config=config(ai_gateway))
    assert "case 'a' has no input 'by'" in (await job(pool, missing_input))["error_msg"]
    assert "not a regular expression" in (await job(pool, bad_regex))["error_msg"]
    assert "no judge model is configured" in (await job(pool, no_judge))["error_msg"]
    assert ai_gateway.requests == []


async def test_a_regex_check_is_checked_off_the_event_loop(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, ai_gateway: FakeAiGateway
) -> None:
    """Python's re.compile checked a regex check's pattern as the payload was read, on the
    event loop: a range of all of Unicode under (?i) is case-folded code point by code point,
    0.5-0.8 s for this pattern of 504 characters (2-3 s at 2,000), in the run's job and again
    in its case's. RE2 checks the pattern when the job starts, in a thread, in a millisecond."""
    await allow_models(pool, workspace, "m/one")
    ai_gateway.plain_answer = lambda r: "Havvind! " * 20

    def run(ref: str, pattern: str) -> dict[str, Any]:
        return {
            "prompt": "p",
            "cases": [{"id": "c", "expect": [{"kind": "regex", "pattern": pattern}]}],
            "models": ["m/one"],
            "ref": ref,
        }

    stored = "SELECT count(*) = $1 FROM prompt_eval_runs"
    async with running_worker(pool, db_url, config=config(ai_gateway), poll_interval_s=0.05):
        # A plain run first: a worker makes its HTTP client (and imports modules) on its first
        # call, on the loop, whatever the job.
        await client.enqueue(pool, workspace, "prompt_eval", run("plain", "Havvind"))
        await wait_for_sql(pool, stored, 1)
        with longest_stall() as stall:
            pattern = "(?i)" + "[\x01-\U0010ffff]" * 100
            await client.enqueue(pool, workspace, "prompt_eval", run("ranges", pattern))
            await wait_for_sql(pool, stored, 2)
    scores = await pool.fetch(
        "SELECT u.run_ref, r.scores FROM prompt_eval_results r"
        " JOIN prompt_eval_runs u ON u.id = r.run_id ORDER BY u.run_ref"
    )
    assert [(r["run_ref"], [(s["passed"], s["detail"]) for s in r["scores"]]) for r in scores] == [
        ("plain", [(True, None)]),
        ("ranges", [(True, None)]),
    ]
    assert stall[0] < 0.1, stall[0]


async def test_a_regex_check_is_judged_by_re2_which_runs_it(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, ai_gateway: FakeAiGateway
) -> None:
    """Python's re judged a regex check's pattern: it refused \\pL, which RE2 runs (and this
    module recommends), raised RecursionError and OverflowError for patterns RE2 runs, a
    transient fault retried for the same payload, and let through backreferences, which RE2
    cannot run, so every model was asked and the check failed each answer. RE2 judges it now,
    before any call."""
    await allow_models(pool, workspace, "m/one")
    ai_gateway.plain_answer = lambda r: "Havvind, nå"
    runs = [
        r"^\pL+, \pL+$",
        "(" * 600 + "Havvind" + ")" * 600,  # past Python's recursion limit
        "a{4294967296}",  # RE2 reads a count it does not take as text; Python overflowed
        r"(ja)\1",
    ]
    ids = [
        await client.enqueue(
            pool,
            workspace,
            "prompt_eval",
            {
                "prompt": "p",
                "cases": [{"id": "c", "expect": [{"kind": "regex", "pattern": pattern}]}],
                "models": ["m/one"],
                "ref": f"run-{i}",
            },
        )
        for i, pattern in enumerate(runs)
    ]
    await run_burst(pool, db_url, config=config(ai_gateway))
    scores = await pool.fetch(
        "SELECT u.run_ref, r.scores FROM prompt_eval_results r"
        " JOIN prompt_eval_runs u ON u.id = r.run_id ORDER BY u.run_ref"
    )
    assert [(r["run_ref"], [s["passed"] for s in r["scores"]]) for r in scores] == [
        ("run-0", [True]),
        ("run-1", [True]),
        ("run-2", [False]),
    ]
    refused = await job(pool, ids[3])
    assert (refused["status"], refused["attempts"]) == ("error", 1)
    assert refused["error_msg"] == (
        "invalid payload: cases.0.expect.0.pattern: not a regular expression RE2 can run "
        "(invalid escape sequence: \\1); backreferences and lookaround are not available"
    )
    assert len(ai_gateway.chat_requests()) == 3  # none for the refused run


def test_schema_subset() -> None:
    schema = {
        "type": "object",
        "required": ["a"],
        "additionalProperties": False,
        "properties": {
            "a": {"type": "integer", "minimum": 1},
            "b": {"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 2},
        },
    }
    assert schema_errors(schema, {"a": 2, "b": ["x"]}) == []
    assert schema_errors(schema, {"a": True}) == ["$.a: expected integer"]
    assert schema_errors(schema, {"b": ["z"], "c": 1}) == [
        "$: missing 'a'",
        "$.b[0]: 'z' not in enum",
        "$: unexpected 'c'",
    ]
    assert re.match(r"\$: expected object", schema_errors(schema, [])[0])


def test_a_schema_check_stops_at_its_step_budget() -> None:
    # Schema size × answer size: a 100,000-value enum against a 10,000-item answer is 10^9
    # comparisons, in a thread the job's timeout cannot stop.
    schema = {"type": "array", "items": {"enum": [f"v{i}" for i in range(100_000)]}}
    answer = json.dumps(["nope"] * 10_000)
    started = time.perf_counter()
    got = score(JsonSchemaCheck(kind="json_schema", schema=schema), answer)
    elapsed_s = time.perf_counter() - started
    assert (got.passed, got.detail) == (
        False,
        f"$: the check took more than its budget of {MAX_SCHEMA_STEPS:,} steps "
        "(schema size × answer size)",
    )
    assert elapsed_s < 0.3
    # A distinct pattern is compiled once per check, however many strings it is matched with.
    patterns = {"type": "array", "items": {"type": "string", "pattern": r"[\pL\pN]{100}"}}
    assert schema_errors(patterns, ["x" * 100] * 1_000) == []


def test_a_pattern_search_is_paid_for_by_the_character() -> None:
    """A schema's `pattern` search cost a step per 64 characters, and RE2 takes up to 4 µs a
    character for some patterns: a 2,000,000-character string cost 31,250 steps and ~8 s of a
    thread the job's timeout cannot stop. A character searched is a step now."""
    schema = {"type": "string", "pattern": r"[\pL\pN ]{20,200}x"}
    started = time.perf_counter()
    got = score(JsonSchemaCheck(kind="json_schema", schema=schema), json.dumps("a" * 2_000_000))
    assert (got.passed, got.detail) == (
        False,
        f"$: the check took more than its budget of {MAX_SCHEMA_STEPS:,} steps "
        "(schema size × answer size)",
    )
    assert time.perf_counter() - started < 1.0


def test_a_regex_check_searches_the_answer_s_first_characters_only() -> None:
    """A model may answer up to the gateway's 16 MB, and RE2 takes up to 4 µs a character for
    some patterns: 20 such checks of one answer held a thread (the job's timeout cannot stop it)
    for 20 minutes. A regex check searches the first MAX_SEARCH_CHARS characters, and a miss
    in a longer answer says so."""
    check = RegexCheck(kind="regex", pattern=r"[\pL\pN ]{20,200}x")
    tail = "a" * (MAX_SEARCH_CHARS + 1_000) + "x"
    started = time.perf_counter()
    got = score(check, tail)
    assert time.perf_counter() - started < 3.0
    assert (got.passed, got.detail) == (
        False,
        f"not found in the answer's first {MAX_SEARCH_CHARS:,} characters "
        f"(of {len(tail):,}); a regex check searches no further",
    )
    assert score(check, "a" * 100 + "x" + "b" * (MAX_SEARCH_CHARS * 2)).passed
    assert score(check, "a" * 100).detail is None


def _deep(levels: int) -> dict[str, object]:
    schema: dict[str, object] = {}
    for _ in range(levels):
        schema = {"type": "array", "items": schema}
    return schema


@pytest.mark.parametrize(
    "schema",
    [
        {"enum": 5},
        {"type": 5},
        {"anyOf": 5},
        {"required": 3},
        {"minimum": "a"},
        {"maxItems": True},
        {"properties": {"a": {"minLength": "x"}}},
        {"items": {"pattern": 7}},
        _deep(2_000),
    ],
)
def test_a_schema_the_check_cannot_apply_is_refused_with_the_payload(
    schema: dict[str, object],
) -> None:
    """A case's schema is part of the payload: one whose keywords have the wrong type (a
    TypeError in the check, or none at all) or that nests past the check's recursion failed
    the case's job as a transient fault, retried for the same schema. It is now refused when
    the payload is read, which fails the job for good, naming the keyword."""
    with pytest.raises(pydantic.ValidationError, match=r"schema"):
        JsonSchemaCheck.model_validate({"kind": "json_schema", "schema": schema})


async def test_an_answer_nested_past_the_parsers_limit_fails_its_json_check(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, ai_gateway: FakeAiGateway
) -> None:
    await allow_models(pool, workspace, "m/one")
    ai_gateway.plain_answer = lambda r: "[" * 100_000
    expect = [{"kind": "json_schema", "schema": {"type": "array"}}]
    await client.enqueue(
        pool,
        workspace,
        "prompt_eval",
        {"prompt": "p", "cases": [{"id": "c", "expect": expect}], "models": ["m/one"]},
    )
    await run_burst(pool, db_url, config=config(ai_gateway))
    cases = await pool.fetch(
        "SELECT status, error_msg FROM job_queue WHERE job_type LIKE 'prompt%'"
    )
    assert {(c["status"], c["error_msg"]) for c in cases} == {("completed", None)}
    scores = await pool.fetchval("SELECT scores FROM prompt_eval_results WHERE case_id = 'c'")
    assert [(s["passed"], s["detail"]) for s in scores] == [
        (False, "not JSON: nested deeper than the parser's recursion limit")
    ]


async def moderate_measured(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, ai_gateway: FakeAiGateway
) -> tuple[asyncpg.Record, int]:
    """One moderation of 'Havvind?' against quiz q1, run to its end: its row, and the most
    memory the process took for it."""
    job_id = await client.enqueue(
        pool,
        workspace,
        "valgomat_moderation",
        {"quiz_id": "q1", "question": "Havvind?", "submission_ref": "sub-1"},
    )
    with peak_memory() as peak:
        await run_burst(pool, db_url, config=config(ai_gateway))
    return await job(pool, job_id), peak[0]


@pytest.mark.parametrize(
    "questions_sql, message",
    [
        # 100,000 questions (any writer's rows), each with a 1,536-number vector: all came over
        # the connection and were decoded on the event loop, and each was compared.
        (
            "SELECT $1, 'q1', 'q' || i, 'Spørsmål ' || i, 'm', '\\x00'::bytea,"
            " array_fill(0.5::real, ARRAY[1536]) FROM generate_series(1, 100000) AS i",
            "quiz 'q1' has 100,000 questions, over the 1,000 a moderation compares with",
        ),
        # One question of 100 MB, sent to the gateway to be embedded.
        (
            "SELECT $1, 'q1', 'q-big', repeat('Havvind? ', 11000000), NULL, NULL, NULL",
            "('q-big') is 99,000,000 bytes, over the 65,536 a question may be",
        ),
    ],
)
async def test_a_quiz_of_absurd_questions_fails_the_moderation_unread(
    pool: asyncpg.Pool,
    db_url: str,
    workspace: UUID,
    ai_gateway: FakeAiGateway,
    questions_sql: str,
    message: str,
) -> None:
    await pool.execute(
        "INSERT INTO valgomat_questions (workspace_id, quiz_id, question_id, text,"
        " embedding_model, embedding_sha256, embedding) " + questions_sql,
        workspace,
    )
    row, peak = await moderate_measured(pool, db_url, workspace, ai_gateway)
    assert (row["status"], row["attempts"]) == ("error", 1)
    assert message in row["error_msg"], row["error_msg"]
    assert peak < 100_000_000, peak
    assert not [r for r in ai_gateway.requests if r.path.endswith("/embeddings")]


async def test_a_question_s_absurd_model_name_and_hash_read_as_missing(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, ai_gateway: FakeAiGateway
) -> None:
    # A model name and a hash of 50 MB each (any writer's), compared with the job's model and
    # the text's SHA-256: both came over the connection whole. They read as missing, and the
    # question is embedded again, its stored model and hash set right.
    ai_gateway.vector = topic_vector
    ai_gateway.answers["Review"] = review
    await add_questions(pool, workspace, "q1", {"q-vind": "Bør det bygges mer havvind?"})
    await pool.execute(
        "UPDATE valgomat_questions SET embedding_model = repeat('m', 50000000),"
        " embedding_sha256 = convert_to(repeat('h', 50000000), 'UTF8'),"
        " embedding = array_fill(0.5::real, ARRAY[5]) WHERE workspace_id = $1",
        workspace,
    )
    row, peak = await moderate_measured(pool, db_url, workspace, ai_gateway)
    assert row["status"] == "completed", row["error_msg"]
    assert peak < 60_000_000, peak
    [emb] = [r for r in ai_gateway.requests if r.path.endswith("/embeddings")]
    assert emb.body["input"] == ["Havvind?", "Bør det bygges mer havvind?"]
    stored = await pool.fetchrow(
        "SELECT embedding_model, octet_length(embedding_sha256) AS hash FROM valgomat_questions"
    )
    assert (stored["embedding_model"], stored["hash"]) == (DEFAULT_EMBEDDING_MODEL, 32)
