"""Workspaces as silos beyond row-level security: a job of workspace A that names B's file,
a repository A's settings do not list, a model A does not allow, or more paid calls than A's
limit fails permanently naming the rule, before any outside call; B's own jobs are unaffected."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import pytest

from sidelinja_worker.jobs.ai.common import DEFAULT_MODEL
from sidelinja_worker.jobs.media_paths import resolve_media_path
from sidelinja_worker.jobs.silos import DEFAULT_MAX_PAID_CALLS, call_guard, check_repo
from sidelinja_worker.queue import client, store
from sidelinja_worker.queue.config import ServiceConfig
from sidelinja_worker.queue.errors import PermanentError
from sidelinja_worker.services.ai_gateway import GuardError
from sidelinja_worker.services.forgejo import check_repo_name
from tests.fakes.ai_gateway_server import FakeAiGateway, ai_gateway_fixture  # noqa: F401
from tests.fakes.fixtures import (  # noqa: F401
    EPISODE_SRT,
    allow_models,
    allow_repos,
    forgejo_fake_fixture,
    media_root_fixture,
    service_config,
    whisper_fake_fixture,
)
from tests.fakes.forgejo_server import FakeForgejo
from tests.fakes.whisper_server import FakeWhisper
from tests.helpers import run_burst

EVAL = {
    "prompt": "Hovedstaden i {{land}}?",
    "cases": [
        {"id": "no", "inputs": {"land": "Norge"}, "expect": [{"kind": "contains", "value": "a"}]},
        {"id": "se", "inputs": {"land": "Sverige"}, "expect": []},
    ],
}


async def _workspace(pool: asyncpg.Pool, name: str) -> UUID:
    return await pool.fetchval("INSERT INTO workspaces (name) VALUES ($1) RETURNING id", name)


async def _outcome(pool: asyncpg.Pool, job_id: UUID) -> tuple[str, int, str | None]:
    row = await store.get_job(pool, job_id)
    assert row is not None
    return row["status"], row["attempts"], row["error_msg"]


def _ai(gw: FakeAiGateway, **more: str) -> ServiceConfig:
    return ServiceConfig({"AI_GATEWAY_URL": gw.url, "AI_GATEWAY_KEY": gw.key, **more})


async def test_a_job_cannot_read_another_workspaces_file(
    pool: asyncpg.Pool, db_url: str, tmp_path: Path
) -> None:
    a, b = await _workspace(pool, "a"), await _workspace(pool, "b")
    root = tmp_path / "media"
    (root / str(a)).mkdir(parents=True)
    (root / str(b) / "srt").mkdir(parents=True)
    b_file = root / str(b) / "srt" / "ep.srt"
    b_file.write_text(EPISODE_SRT, "utf-8")
    (root / str(a) / "link.srt").symlink_to(b_file)
    jobs_a = [
        await client.enqueue(pool, a, "srt_parse", {"transcript_ref": "x", "srt_path": path})
        for path in (f"../{b}/srt/ep.srt", str(b_file), "link.srt")
    ]
    job_b = await client.enqueue(
        pool, b, "srt_parse", {"transcript_ref": "x", "srt_path": "srt/ep.srt"}
    )
    await run_burst(pool, db_url, config=ServiceConfig({"MEDIA_ROOT": str(root)}))
    rule = f"is outside this workspace's media folder (MEDIA_ROOT/{a})"
    for job_id in jobs_a:
        status, attempts, error = await _outcome(pool, job_id)
        assert (status, attempts) == ("error", 1) and error is not None and rule in error
    assert (await _outcome(pool, job_b))[0] == "completed"
    assert await pool.fetchval("SELECT count(*) FROM transcripts WHERE workspace_id = $1", a) == 0
    assert await pool.fetchval("SELECT count(*) FROM transcripts WHERE workspace_id = $1", b) == 1


async def test_a_workspace_without_a_media_folder_is_told_so(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, tmp_path: Path
) -> None:
    job_id = await client.enqueue(
        pool, workspace, "stats_parse", {"logs": "logs", "schedule": False}
    )
    await run_burst(pool, db_url, config=ServiceConfig({"MEDIA_ROOT": str(tmp_path)}))
    assert await _outcome(pool, job_id) == (
        "error",
        1,
        f"this workspace has no media folder (MEDIA_ROOT/{workspace})",
    )


@pytest.mark.parametrize("target", ["other workspace", "media root"])
async def test_a_workspace_folder_that_is_a_symlink_is_refused(
    pool: asyncpg.Pool, db_url: str, tmp_path: Path, target: str
) -> None:
    # A's folder made a symlink to B's (or to MEDIA_ROOT itself): A's jobs read B's files
    # through it, every check passing, as the resolved folder was taken for A's own.
    a, b = await _workspace(pool, "a"), await _workspace(pool, "b")
    root = tmp_path / "media"
    (root / str(b) / "srt").mkdir(parents=True)
    (root / str(b) / "srt" / "ep.srt").write_text(EPISODE_SRT, "utf-8")
    (root / str(a)).symlink_to(root / str(b) if target == "other workspace" else root)
    path = "srt/ep.srt" if target == "other workspace" else f"{b}/srt/ep.srt"
    jobs_a = [
        await client.enqueue(pool, a, "srt_parse", {"transcript_ref": "x", "srt_path": path}),
        await client.enqueue(pool, a, "stats_parse", {"logs": "srt", "schedule": False}),
    ]
    job_b = await client.enqueue(
        pool, b, "srt_parse", {"transcript_ref": "x", "srt_path": "srt/ep.srt"}
    )
    await run_burst(pool, db_url, config=ServiceConfig({"MEDIA_ROOT": str(root)}))
    rule = f"this workspace's media folder (MEDIA_ROOT/{a}) is a symlink, refused"
    for job_id in jobs_a:
        status, attempts, error = await _outcome(pool, job_id)
        assert (status, attempts) == ("error", 1) and error is not None and rule in error
    assert (await _outcome(pool, job_b))[0] == "completed"
    assert await pool.fetchval("SELECT count(*) FROM transcripts WHERE workspace_id = $1", a) == 0


async def test_a_job_cannot_use_a_repository_its_workspace_does_not_list(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, forgejo_fake: FakeForgejo
) -> None:
    # `workspace` (B) lists sidelinja/transcripts (the fixture); A lists another repository.
    a = await _workspace(pool, "a")
    await allow_repos(pool, a, "a-org/transcripts")
    sha = forgejo_fake.commit("sidelinja", "transcripts", "main", "ep.srt", EPISODE_SRT.encode())
    source = {"owner": "sidelinja", "repo": "transcripts", "path": "ep.srt", "ref": sha}
    job_a = await client.enqueue(pool, a, "srt_parse", {"transcript_ref": "x", "forgejo": source})
    calls_before = len(forgejo_fake.calls)
    await run_burst(pool, db_url, config=service_config(forgejo=forgejo_fake))
    assert await _outcome(pool, job_a) == (
        "error",
        1,
        "Forgejo repository 'sidelinja/transcripts' is not allowed in this workspace "
        "(workspace setting forgejo.repos: 1 listed)",
    )
    assert len(forgejo_fake.calls) == calls_before  # refused before any request

    job_b = await client.enqueue(
        pool, workspace, "srt_parse", {"transcript_ref": "x", "forgejo": source}
    )
    await run_burst(pool, db_url, config=service_config(forgejo=forgejo_fake))
    assert (await _outcome(pool, job_b))[0] == "completed"


async def test_a_repository_name_cannot_step_out_of_an_allowed_owner(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, forgejo_fake: FakeForgejo
) -> None:
    """`forgejo.repos` may allow a whole owner (`sidelinja/*`). A repository named `..` was sent
    as it was, and the URL's normalisation took it for a step up: `sidelinja/..` with the path
    `a/contents/ep.srt` read repository `contents/a`, another owner's. Owner and repository are
    Forgejo names, and such a job fails for good before any request."""
    await allow_repos(pool, workspace, "sidelinja/*")
    forgejo_fake.commit("contents", "a", "main", "ep.srt", EPISODE_SRT.encode())
    source = {"owner": "sidelinja", "repo": "..", "path": "a/contents/ep.srt"}
    job = await client.enqueue(
        pool, workspace, "srt_parse", {"transcript_ref": "x", "forgejo": source}
    )
    calls_before = len(forgejo_fake.calls)
    await run_burst(pool, db_url, config=service_config(forgejo=forgejo_fake))
    status, attempts, error = await _outcome(pool, job)
    assert (status, attempts) == ("error", 1), error
    assert error is not None and "must be a Forgejo name" in error
    assert len(forgejo_fake.calls) == calls_before


@pytest.mark.parametrize("name", ["..", ".", "", "a/b", "a%2Fb", "a b", "ø", "x" * 101])
def test_a_forgejo_name_is_letters_digits_dash_underscore_and_dot(name: str) -> None:
    with pytest.raises(ValueError, match="must be a Forgejo name"):
        check_repo_name(name)
    assert check_repo_name("Sidelinja.Transcripts_2-x") == "Sidelinja.Transcripts_2-x"


async def test_a_transcription_cannot_commit_to_a_repository_its_workspace_does_not_list(
    pool: asyncpg.Pool,
    db_url: str,
    workspace: UUID,
    media_root: Path,
    whisper_fake: FakeWhisper,
    forgejo_fake: FakeForgejo,
) -> None:
    target = {"owner": "other-org", "repo": "secrets", "path": "ep.srt"}
    body = {"audio_path": "episodes/ep1.wav", "transcript_ref": "x", "forgejo": target}
    job_id = await client.enqueue(pool, workspace, "whisper_transcribe", body)
    config = service_config(media_root, whisper=whisper_fake, forgejo=forgejo_fake)
    await run_burst(pool, db_url, config=config)
    assert await _outcome(pool, job_id) == (
        "error",
        1,
        "Forgejo repository 'other-org/secrets' is not allowed in this workspace "
        "(workspace setting forgejo.repos: 1 listed)",
    )
    assert not whisper_fake.uploads and forgejo_fake.calls == []  # nothing paid, nothing read


async def test_a_job_cannot_name_a_model_its_workspace_does_not_allow(
    pool: asyncpg.Pool, db_url: str, ai_gateway: FakeAiGateway
) -> None:
    a, b = await _workspace(pool, "a"), await _workspace(pool, "b")
    await allow_models(pool, b, "pricey/model")
    body = {**EVAL, "models": ["pricey/model"]}
    job_a = await client.enqueue(pool, a, "prompt_eval", body)
    await run_burst(pool, db_url, config=_ai(ai_gateway))
    status, attempts, error = await _outcome(pool, job_a)
    assert (status, attempts) == ("error", 1)
    assert error == (
        "model 'pricey/model' is not allowed in this workspace (workspace setting ai.models "
        "unset: only the models its settings name and the defaults)"
    )
    assert ai_gateway.requests == []

    job_b = await client.enqueue(pool, b, "prompt_eval", body)
    await run_burst(pool, db_url, config=_ai(ai_gateway))
    assert (await _outcome(pool, job_b))[0] == "completed"
    assert {r.body["model"] for r in ai_gateway.requests} == {"pricey/model"}


@pytest.mark.parametrize(
    ("settings", "error"),
    [
        (
            {"ai": {"names": ["x" * 1000] * 30_000}},
            "the workspace's settings are 30,120,019 bytes of JSON, over the cap of 1,048,576:"
            " keep big lists elsewhere",
        ),
        (["ai"], "the workspace's settings are an array in JSON, not an object"),
        (7, "the workspace's settings are a number in JSON, not an object"),
    ],
)
async def test_workspace_settings_that_are_huge_or_no_object_fail_the_job_for_good(
    pool: asyncpg.Pool,
    db_url: str,
    ai_gateway: FakeAiGateway,
    settings: Any,
    error: str,
) -> None:
    """The web app writes a workspace's settings, and every job of most types reads them:
    30 MB were decoded on the event loop at each read; a number failed each attempt with a
    TypeError, retried until its attempts ran out, and an array of two-letter strings was read
    as pairs. Each ends the job at once, saying why."""
    ws = await pool.fetchval(
        "INSERT INTO workspaces (name, settings) VALUES ('big', $1) RETURNING id", settings
    )
    job = await client.enqueue(pool, ws, "prompt_eval", {**EVAL, "models": [DEFAULT_MODEL]})
    await run_burst(pool, db_url, config=_ai(ai_gateway))
    assert await _outcome(pool, job) == ("error", 1, error)
    assert ai_gateway.requests == []


async def test_a_model_from_the_workspaces_own_settings_is_allowed_by_default(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, ai_gateway: FakeAiGateway
) -> None:
    await pool.execute(
        "UPDATE workspaces SET settings = $2 WHERE id = $1",
        workspace,
        {"ai": {"prompt_eval": {"judge_model": "judge/model"}, "model": "house/model"}},
    )
    job_id = await client.enqueue(
        pool, workspace, "prompt_eval", {**EVAL, "models": ["house/model"]}
    )
    await run_burst(pool, db_url, config=_ai(ai_gateway))
    assert (await _outcome(pool, job_id))[0] == "completed"


async def test_paid_calls_past_the_workspaces_limit_fail_before_any_call(
    pool: asyncpg.Pool, db_url: str, ai_gateway: FakeAiGateway
) -> None:
    a, b = await _workspace(pool, "a"), await _workspace(pool, "b")
    for ws in (a, b):
        await allow_models(pool, ws, "m/one", "m/two", DEFAULT_MODEL)
    await pool.execute(
        "UPDATE workspaces SET settings = jsonb_set(settings, '{ai,max_paid_calls_per_job}', '3') "
        "WHERE id = $1",
        a,
    )
    await pool.execute(
        "UPDATE workspaces SET settings = jsonb_set(settings, '{ai,context_tokens}', '50') "
        "WHERE id = $1",
        a,
    )
    body = {**EVAL, "models": ["m/one", "m/two"]}  # 2 cases x 2 models = 4 calls
    job_a = await client.enqueue(pool, a, "prompt_eval", body)
    long_text = "Et ord til. " * 200  # 2400 characters: 16 parts of 150
    summary_a = await client.enqueue(pool, a, "meeting_summarize", {"text": long_text})
    await run_burst(pool, db_url, config=_ai(ai_gateway))
    assert await _outcome(pool, job_a) == (
        "error",
        1,
        "2 cases x 2 models and 0 judge checks needs 4 paid AI calls, over this job's limit of "
        "3 (workspace setting ai.max_paid_calls_per_job)",
    )
    status, _, error = await _outcome(pool, summary_a)
    assert status == "error" and error is not None
    assert error.startswith("a text in 17 parts needs 33 paid AI calls, over this job's limit")
    assert ai_gateway.requests == []

    job_b = await client.enqueue(pool, b, "prompt_eval", body)
    await run_burst(pool, db_url, config=_ai(ai_gateway))
    assert (await _outcome(pool, job_b))[0] == "completed"
    assert len(ai_gateway.requests) == 4


def test_the_guard_counts_every_call_and_stops_past_the_limit() -> None:
    guard = call_guard({"ai": {"models": ["m"], "max_paid_calls_per_job": 2}}, ())
    guard.spend("m")
    guard.spend("m")
    with pytest.raises(GuardError, match="past its limit of 2 paid AI calls"):
        guard.spend("m")
    assert call_guard({}, ("d/default",)).max_calls == DEFAULT_MAX_PAID_CALLS


@pytest.mark.parametrize(
    "settings, words",
    [
        ({"ai": {"max_paid_calls_per_job": 0}}, "ai.max_paid_calls_per_job: expected a whole"),
        ({"ai": {"max_paid_calls_per_job": "9"}}, "ai.max_paid_calls_per_job: expected a whole"),
        ({"ai": {"models": "m"}}, "ai.models: expected a list of names"),
        ({"ai": "m"}, "workspace settings ai: expected an object"),
    ],
)
def test_bad_limit_settings_are_named(settings: dict[str, Any], words: str) -> None:
    with pytest.raises(PermanentError, match=words):
        call_guard(settings, ())


def test_repository_entries_match_owner_and_name_or_a_whole_owner() -> None:
    settings = {"forgejo": {"repos": ["Org/Transcripts", "team/*"]}}
    check_repo(settings, "org", "transcripts")
    check_repo(settings, "team", "anything")
    for owner, repo in (("org", "other"), ("teamx", "a"), ("other", "transcripts")):
        with pytest.raises(PermanentError, match="forgejo.repos: 2 listed"):
            check_repo(settings, owner, repo)
    with pytest.raises(PermanentError, match="forgejo.repos: none set"):
        check_repo({}, "org", "transcripts")


def test_a_path_through_a_symlink_loop_is_a_permanent_error_naming_it(tmp_path: Path) -> None:
    # Python 3.11 resolves a loop with RuntimeError: uncaught, a job calling resolve_media_path
    # failed as transient and was tried again, to the same loop, until its last attempt.
    workspace = uuid4()
    folder = tmp_path / str(workspace)
    folder.mkdir()
    (folder / "loop").symlink_to(folder / "loop")
    with pytest.raises(PermanentError) as raised:
        resolve_media_path(str(tmp_path), workspace, "loop/programme.txt")
    assert str(raised.value).startswith("path 'loop/programme.txt' cannot be resolved")
