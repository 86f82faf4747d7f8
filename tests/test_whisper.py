"""whisper_transcribe against real HTTP stand-ins for speaches, Forgejo and LiveKit: the chain to
srt_parse, each error class, the resource governor, path confinement and secrets."""

from __future__ import annotations

import hashlib
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID

import asyncpg
import orjson
import pytest

from sidelinja_worker.jobs.transcripts import store as transcripts_store
from sidelinja_worker.jobs.transcripts import whisper_transcribe
from sidelinja_worker.queue import client
from sidelinja_worker.queue.config import ServiceConfig
from sidelinja_worker.services.whisper import CHUNK_BYTES, _Multipart
from tests.fakes.fixtures import (  # noqa: F401  (pytest finds fixtures by module name)
    EPISODE_SRT,
    FORGEJO_READ_TOKEN,
    SECRETS,
    WHISPER_KEY,
    forgejo_fake_fixture,
    governed_whisper_fake_fixture,
    livekit_fake_fixture,
    media_root_fixture,
    service_config,
    whisper_fake_fixture,
)
from tests.fakes.forgejo_server import FakeForgejo
from tests.fakes.livekit_server import FakeLiveKit
from tests.fakes.whisper_server import FakeWhisper
from tests.helpers import make_workspace, run_burst

SRT_PATH = "episodes/ep-1.srt"


async def drain(pool: asyncpg.Pool, db_url: str, **kwargs: Any) -> None:
    """Bursts until no job is due. A follow-up committed with its parent's completion can land
    just after a burst worker judged the queue drained (its outcome was still buffered); a
    second burst runs it."""
    for _ in range(3):
        await run_burst(pool, db_url, **kwargs)
        if not await pool.fetchval(
            "SELECT count(*) FROM job_queue WHERE status IN "
            "('pending', 'retry') AND scheduled_for <= now()"
        ):
            return


def payload(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "audio_path": "episodes/ep1.wav",
        "transcript_ref": "ep-1",
        "forgejo": {
            "owner": "sidelinja",
            "repo": "transcripts",
            "path": SRT_PATH,
            "branch": "main",
        },
    }
    return {**body, **overrides}


async def enqueue(pool: asyncpg.Pool, workspace: UUID, body: dict[str, Any] | None = None) -> UUID:
    return await client.enqueue(pool, workspace, "whisper_transcribe", body or payload())


async def job(pool: asyncpg.Pool, job_id: UUID) -> asyncpg.Record:
    row = await pool.fetchrow("SELECT * FROM job_queue WHERE id = $1", job_id)
    assert row is not None
    return row


def assert_no_secrets(row: asyncpg.Record) -> None:
    shown = " ".join(
        [
            str(row["error_msg"]),
            orjson.dumps(row["result"]).decode(),
            orjson.dumps(row["errors"]).decode(),
            orjson.dumps(row["progress"]).decode(),
        ]
    )
    for secret in SECRETS:
        assert secret not in shown


def held_open(path: Path) -> int:
    """How many of this process's descriptors (the worker's: it runs in the test's process) are
    open on `path`."""
    held = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            held += os.readlink(f"/proc/self/fd/{fd}") == str(path)
        except OSError:  # closed since it was listed
            pass
    return held


async def only_follow_up(pool: asyncpg.Pool) -> asyncpg.Record:
    rows = await pool.fetch("SELECT * FROM job_queue WHERE job_type = 'srt_parse'")
    assert len(rows) == 1
    return rows[0]


async def test_transcribe_commits_and_chains_to_srt_parse(
    pool: asyncpg.Pool,
    db_url: str,
    workspace: UUID,
    media_root: Path,
    whisper_fake: FakeWhisper,
    forgejo_fake: FakeForgejo,
) -> None:
    events: list[dict[str, Any]] = []
    listener = await asyncpg.connect(db_url)
    await listener.add_listener(
        "sidelinja_job_events", lambda *a: events.append(orjson.loads(a[3]))
    )
    job_id = await enqueue(pool, workspace)
    await drain(
        pool, db_url, config=service_config(media_root, whisper=whisper_fake, forgejo=forgejo_fake)
    )
    await listener.execute("SELECT 1")  # every notification sent before now has arrived
    await listener.close()

    row = await job(pool, job_id)
    assert row["status"] == "completed", row["error_msg"]
    upload = whisper_fake.uploads[0]
    audio = (media_root / "episodes" / "ep1.wav").read_bytes()
    assert upload.fields == {
        "model": "Systran/faster-whisper-large-v3",
        "language": "no",
        "response_format": "srt",
    }
    assert (upload.filename, upload.size) == ("ep1.wav", len(audio))
    assert upload.sha256 == hashlib.sha256(audio).hexdigest()
    committed = forgejo_fake.repos[("sidelinja", "transcripts")].branches["main"][SRT_PATH]
    assert committed.decode() == EPISODE_SRT
    result = row["result"]
    assert result["forgejo"]["action"] == "created" and result["segments"] == 10
    assert result["governor"] == {
        "whisper": "default",
        "live_rooms": None,
        "reason": "no LiveKit configured: not governed",
    }

    parse = await only_follow_up(pool)
    assert parse["status"] == "completed" and parse["workspace_id"] == workspace
    assert parse["payload"]["forgejo"]["ref"] == result["forgejo"]["commit_sha"]
    segments = await transcripts_store.get_segments(pool, workspace, "ep-1")
    assert len(segments) == 10 and segments[0]["text"] == "Hei, og velkommen til Sidelinja."
    messages = [
        e["progress"]["message"] for e in events if e.get("id") == str(job_id) and e.get("progress")
    ]
    assert messages[0] == "Laster opp lydfilen…"
    assert "Venter på transkripsjonen…" in messages
    assert messages[-1] == "Lagrer transkripsjonen i Forgejo…"


async def test_existing_file_is_updated_with_its_sha_and_same_content_makes_no_commit(
    pool: asyncpg.Pool,
    db_url: str,
    workspace: UUID,
    media_root: Path,
    whisper_fake: FakeWhisper,
    forgejo_fake: FakeForgejo,
) -> None:
    old = b"1\n00:00:00,000 --> 00:00:01,000\nold\n"
    forgejo_fake.commit("sidelinja", "transcripts", "main", SRT_PATH, old)
    config = service_config(media_root, whisper=whisper_fake, forgejo=forgejo_fake)
    first = await enqueue(pool, workspace)
    await drain(pool, db_url, config=config)
    second = await enqueue(pool, workspace)
    await drain(pool, db_url, config=config)

    assert (await job(pool, first))["result"]["forgejo"]["action"] == "updated"
    put = next(c for c in forgejo_fake.calls if c.method == "PUT")
    assert put.status == 200 and put.body is not None and put.body["sha"]
    assert (await job(pool, second))["result"]["forgejo"]["action"] == "unchanged"
    assert [c.method for c in forgejo_fake.calls].count("PUT") == 1


async def test_a_conflict_is_read_again_and_retried(
    pool: asyncpg.Pool,
    db_url: str,
    workspace: UUID,
    media_root: Path,
    whisper_fake: FakeWhisper,
    forgejo_fake: FakeForgejo,
) -> None:
    forgejo_fake.commit("sidelinja", "transcripts", "main", SRT_PATH, b"")
    forgejo_fake.concurrent_edits = 1
    job_id = await enqueue(pool, workspace)
    await drain(
        pool, db_url, config=service_config(media_root, whisper=whisper_fake, forgejo=forgejo_fake)
    )
    row = await job(pool, job_id)
    assert row["status"] == "completed" and row["result"]["forgejo"]["action"] == "updated"
    assert [c.status for c in forgejo_fake.calls if c.method == "PUT"] == [409, 200]


async def test_endless_conflicts_become_a_transient_failure(
    pool: asyncpg.Pool,
    db_url: str,
    workspace: UUID,
    media_root: Path,
    whisper_fake: FakeWhisper,
    forgejo_fake: FakeForgejo,
) -> None:
    forgejo_fake.commit("sidelinja", "transcripts", "main", SRT_PATH, b"")
    forgejo_fake.concurrent_edits = 100
    job_id = await enqueue(pool, workspace)
    await drain(
        pool, db_url, config=service_config(media_root, whisper=whisper_fake, forgejo=forgejo_fake)
    )
    row = await job(pool, job_id)
    assert row["status"] == "retry" and "kept changing" in row["error_msg"]
    assert not await pool.fetchval("SELECT count(*) FROM job_queue WHERE job_type = 'srt_parse'")


def _unknown_model(w: FakeWhisper, root: Path, body: dict[str, Any]) -> dict[str, str]:
    body["model"] = "Systran/faster-whisper-tiny"
    return {}


def _undecodable(w: FakeWhisper, root: Path, body: dict[str, Any]) -> dict[str, str]:
    (root / "episodes" / "notes.wav").write_text("not audio at all")
    body["audio_path"] = "episodes/notes.wav"
    return {}


def _empty(w: FakeWhisper, root: Path, body: dict[str, Any]) -> dict[str, str]:
    (root / "episodes" / "empty.wav").write_bytes(b"")
    body["audio_path"] = "episodes/empty.wav"
    return {}


def _wrong_key(w: FakeWhisper, root: Path, body: dict[str, Any]) -> dict[str, str]:
    w.api_key = "the-right-key"
    return {"WHISPER_API_KEY": WHISPER_KEY}


def _busy(w: FakeWhisper, root: Path, body: dict[str, Any]) -> dict[str, str]:
    w.fail_next.append((503, {"Retry-After": "120"}))
    return {}


def _down(w: FakeWhisper, root: Path, body: dict[str, Any]) -> dict[str, str]:
    return {"WHISPER_URL": "http://127.0.0.1:9"}  # the discard port: nothing listens


@pytest.mark.parametrize(
    "setup, status, words",
    [
        (_unknown_model, "error", "model 'Systran/faster-whisper-tiny' is not installed"),
        (_undecodable, "error", "whisper answered 415: Unsupported audio file type"),
        (_empty, "error", "whisper answered 400: Audio file is probably empty"),
        (_wrong_key, "error", "whisper refused the API key (403)"),
        (_busy, "retry", "whisper answered 503"),
        (_down, "retry", "whisper unreachable"),
    ],
)
async def test_whisper_errors_are_classified(
    pool: asyncpg.Pool,
    db_url: str,
    workspace: UUID,
    media_root: Path,
    whisper_fake: FakeWhisper,
    forgejo_fake: FakeForgejo,
    setup: Any,
    status: str,
    words: str,
) -> None:
    body = payload()
    extra = setup(whisper_fake, media_root, body)
    job_id = await enqueue(pool, workspace, body)
    await drain(
        pool,
        db_url,
        config=service_config(media_root, whisper=whisper_fake, forgejo=forgejo_fake, **extra),
    )
    row = await job(pool, job_id)
    assert (row["status"], row["attempts"]) == (status, 1)
    assert words in row["error_msg"]
    assert not [c for c in forgejo_fake.calls if c.method != "GET"]
    assert_no_secrets(row)
    assert not held_open(media_root / "episodes" / "ep1.wav")  # the job closed its audio file
    if setup is _busy:  # Retry-After honoured instead of the 30 s backoff
        wait_s = (row["scheduled_for"] - datetime.now(UTC)).total_seconds()
        assert 100 < wait_s <= 120


@pytest.mark.parametrize(
    "setup, status, words",
    [
        (
            lambda f, c: c.update(FORGEJO_TOKEN="fj-wrong-token"),
            "error",
            "Forgejo refused the token (401",
        ),
        (lambda f, c: c.update(FORGEJO_TOKEN=FORGEJO_READ_TOKEN), "error", "Forgejo answered 403"),
        (lambda f, c: f.repos.clear(), "error", "Forgejo answered 404"),
        (
            lambda f, c: setattr(f.repos[("sidelinja", "transcripts")], "archived", True),
            "error",
            "Forgejo answered 423: repo is archived",
        ),
        (
            lambda f, c: setattr(f, "quota_bytes", 10),
            "error",
            "Forgejo answered 413: quota exceeded",
        ),
        (lambda f, c: f.fail_next.extend([(502, {})] * 5), "retry", "Forgejo answered 502"),
        (
            lambda f, c: f.fail_next.append((503, {"Retry-After": "600"})),
            "retry",
            "Forgejo answered 503",
        ),
    ],
)
async def test_forgejo_errors_are_classified(
    pool: asyncpg.Pool,
    db_url: str,
    workspace: UUID,
    media_root: Path,
    whisper_fake: FakeWhisper,
    forgejo_fake: FakeForgejo,
    setup: Any,
    status: str,
    words: str,
) -> None:
    config = dict(service_config(media_root, whisper=whisper_fake, forgejo=forgejo_fake).values)
    setup(forgejo_fake, config)
    job_id = await enqueue(pool, workspace)
    await drain(pool, db_url, config=ServiceConfig(config))
    row = await job(pool, job_id)
    assert (row["status"], row["attempts"]) == (status, 1)
    assert words in row["error_msg"]
    assert_no_secrets(row)


async def test_a_transient_forgejo_failure_at_the_commit_sends_no_second_upload(
    pool: asyncpg.Pool,
    db_url: str,
    workspace: UUID,
    media_root: Path,
    whisper_fake: FakeWhisper,
    forgejo_fake: FakeForgejo,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One 502 (then a 503 with Retry-After: 1) of Forgejo's at the commit failed the job, and
    its retry sent the audio to whisper again: hours of transcription for a blip. The commit is
    tried again within the job; whisper is asked once."""
    monkeypatch.setattr(whisper_transcribe, "COMMIT_RETRY_S", (0.05,) * 3, raising=False)
    config = service_config(media_root, whisper=whisper_fake, forgejo=forgejo_fake)
    forgejo_fake.fail_next.extend([(502, {}), (503, {"Retry-After": "1"})])
    job_id = await enqueue(pool, workspace)
    await drain(pool, db_url, config=config)
    row = await job(pool, job_id)
    assert (row["status"], row["attempts"]) == ("completed", 1), row["error_msg"]
    assert len(whisper_fake.uploads) == 1
    assert SRT_PATH in forgejo_fake.repos[("sidelinja", "transcripts")].branches["main"]
    assert [c.status for c in forgejo_fake.calls][:2] == [502, 503]


async def test_a_token_echoed_by_forgejo_is_blanked(
    pool: asyncpg.Pool,
    db_url: str,
    workspace: UUID,
    media_root: Path,
    whisper_fake: FakeWhisper,
    forgejo_fake: FakeForgejo,
) -> None:
    forgejo_fake.echo_token = True
    job_id = await enqueue(pool, workspace)
    await drain(
        pool,
        db_url,
        config=service_config(
            media_root, whisper=whisper_fake, forgejo=forgejo_fake, FORGEJO_TOKEN=FORGEJO_READ_TOKEN
        ),
    )
    row = await job(pool, job_id)
    assert row["status"] == "error" and "(got token ***)" in row["error_msg"]
    assert_no_secrets(row)


async def test_a_live_room_routes_to_the_governed_whisper(
    pool: asyncpg.Pool,
    db_url: str,
    workspace: UUID,
    media_root: Path,
    whisper_fake: FakeWhisper,
    governed_whisper_fake: FakeWhisper,
    forgejo_fake: FakeForgejo,
    livekit_fake: FakeLiveKit,
) -> None:
    livekit_fake.rooms = [{"name": "morgensending", "num_participants": 3}, {"name": "tomt-rom"}]
    ids = [await enqueue(pool, workspace, payload(transcript_ref=f"ep-{i}")) for i in range(2)]
    await drain(
        pool,
        db_url,
        max_concurrent=1,
        config=service_config(
            media_root,
            whisper=whisper_fake,
            governed=governed_whisper_fake,
            forgejo=forgejo_fake,
            livekit_fake=livekit_fake,
        ),
    )
    for job_id in ids:
        row = await job(pool, job_id)
        assert row["status"] == "completed", row["error_msg"]
        assert row["result"]["governor"]["whisper"] == "governed"
        assert row["result"]["governor"]["live_rooms"] == 1
        assert "morgensending" in row["result"]["governor"]["reason"]
    assert len(governed_whisper_fake.uploads) == 2 and not whisper_fake.uploads
    assert livekit_fake.calls == 1  # the room list is cached across jobs
    assert livekit_fake.claims[0]["video"] == {"roomList": True}


async def test_a_live_room_without_governed_whisper_defers_the_job(
    pool: asyncpg.Pool,
    db_url: str,
    workspace: UUID,
    media_root: Path,
    whisper_fake: FakeWhisper,
    forgejo_fake: FakeForgejo,
    livekit_fake: FakeLiveKit,
) -> None:
    livekit_fake.rooms = [{"name": "morgensending", "num_participants": 2}]
    job_id = await enqueue(pool, workspace)
    await drain(
        pool,
        db_url,
        config=service_config(
            media_root, whisper=whisper_fake, forgejo=forgejo_fake, livekit_fake=livekit_fake
        ),
    )
    row = await job(pool, job_id)
    assert (row["status"], row["attempts"]) == ("pending", 0)  # a deferral is not an attempt
    wait_s = (row["scheduled_for"] - datetime.now(UTC)).total_seconds()
    assert 40 < wait_s <= 60
    assert "no WHISPER_GOVERNED_URL" in row["progress"]["message"]
    assert not whisper_fake.uploads and not forgejo_fake.calls
    assert not held_open(media_root / "episodes" / "ep1.wav")  # deferred, it closed its file


async def test_rooms_without_participants_do_not_govern(
    pool: asyncpg.Pool,
    db_url: str,
    workspace: UUID,
    media_root: Path,
    whisper_fake: FakeWhisper,
    governed_whisper_fake: FakeWhisper,
    forgejo_fake: FakeForgejo,
    livekit_fake: FakeLiveKit,
) -> None:
    livekit_fake.rooms = [{"name": "venterom", "num_participants": 0}]
    job_id = await enqueue(pool, workspace)
    await drain(
        pool,
        db_url,
        config=service_config(
            media_root,
            whisper=whisper_fake,
            governed=governed_whisper_fake,
            forgejo=forgejo_fake,
            livekit_fake=livekit_fake,
        ),
    )
    governor = (await job(pool, job_id))["result"]["governor"]
    assert governor == {
        "whisper": "default",
        "live_rooms": 0,
        "reason": "no LiveKit room has participants",
    }
    assert len(whisper_fake.uploads) == 1 and not governed_whisper_fake.uploads


async def test_livekit_refusing_the_token_fails_without_the_secret(
    pool: asyncpg.Pool,
    db_url: str,
    workspace: UUID,
    media_root: Path,
    whisper_fake: FakeWhisper,
    forgejo_fake: FakeForgejo,
    livekit_fake: FakeLiveKit,
) -> None:
    livekit_fake.api_secret = "a-different-secret-long-enough-for-hs256"
    job_id = await enqueue(pool, workspace)
    await drain(
        pool,
        db_url,
        config=service_config(
            media_root, whisper=whisper_fake, forgejo=forgejo_fake, livekit_fake=livekit_fake
        ),
    )
    row = await job(pool, job_id)
    assert row["status"] == "error"
    assert row["error_msg"].startswith("LiveKit answered 401: invalid token")
    assert "LIVEKIT_API_SECRET" in row["error_msg"]
    assert_no_secrets(row)


async def test_livekit_down_uses_the_governed_whisper_or_retries(
    pool: asyncpg.Pool,
    db_url: str,
    workspace: UUID,
    media_root: Path,
    whisper_fake: FakeWhisper,
    governed_whisper_fake: FakeWhisper,
    forgejo_fake: FakeForgejo,
    livekit_fake: FakeLiveKit,
) -> None:
    livekit_fake.fail_next = [503, 503]
    with_governed = await enqueue(pool, workspace)
    await drain(
        pool,
        db_url,
        config=service_config(
            media_root,
            whisper=whisper_fake,
            governed=governed_whisper_fake,
            forgejo=forgejo_fake,
            livekit_fake=livekit_fake,
        ),
    )
    without = await enqueue(pool, workspace)
    await drain(
        pool,
        db_url,
        config=service_config(
            media_root, whisper=whisper_fake, forgejo=forgejo_fake, livekit_fake=livekit_fake
        ),
    )
    row = await job(pool, with_governed)
    assert row["status"] == "completed" and row["result"]["governor"]["whisper"] == "governed"
    row = await job(pool, without)
    assert row["status"] == "retry" and row["error_msg"].startswith("LiveKit answered 503")


@pytest.mark.parametrize(
    "audio_path, words",
    [
        ("../../etc/passwd", "is outside this workspace's media folder"),
        ("/etc/passwd", "is outside this workspace's media folder"),
        ("episodes/../../outside.wav", "is outside this workspace's media folder"),
        ("episodes/link.wav", "is outside this workspace's media folder"),
        ("episodes/missing.wav", "not found in this workspace's media folder"),
        ("episodes", "not found in this workspace's media folder"),
    ],
)
async def test_audio_paths_are_confined_to_media_root(
    pool: asyncpg.Pool,
    db_url: str,
    workspace: UUID,
    media_root: Path,
    whisper_fake: FakeWhisper,
    forgejo_fake: FakeForgejo,
    audio_path: str,
    words: str,
) -> None:
    outside = media_root.parent / "outside.wav"
    outside.write_bytes(b"RIFF secret")
    os.symlink(outside, media_root / "episodes" / "link.wav")
    job_id = await enqueue(pool, workspace, payload(audio_path=audio_path))
    await drain(
        pool, db_url, config=service_config(media_root, whisper=whisper_fake, forgejo=forgejo_fake)
    )
    row = await job(pool, job_id)
    assert (row["status"], row["attempts"]) == ("error", 1)
    assert words in row["error_msg"]
    assert not whisper_fake.uploads


async def test_a_hard_link_to_another_workspaces_audio_is_never_uploaded(
    pool: asyncpg.Pool,
    db_url: str,
    workspace: UUID,
    media_root: Path,
    whisper_fake: FakeWhisper,
    forgejo_fake: FakeForgejo,
) -> None:
    # A hard link passes every path check (it is a name in this folder), yet it is the other
    # workspace's file: refused before the upload.
    other = media_root.parent / "another-workspace"
    other.mkdir()
    (other / "interview.wav").write_bytes(b"RIFF secret")
    os.link(other / "interview.wav", media_root / "episodes" / "linked.wav")
    job_id = await enqueue(pool, workspace, payload(audio_path="episodes/linked.wav"))
    await drain(
        pool, db_url, config=service_config(media_root, whisper=whisper_fake, forgejo=forgejo_fake)
    )
    row = await job(pool, job_id)
    assert (row["status"], row["attempts"], row["error_msg"]) == (
        "error",
        1,
        "file 'episodes/linked.wav' has 2 links: a hard link may be another workspace's file, "
        "refused",
    )
    assert not whisper_fake.uploads


async def test_an_absolute_path_inside_media_root_is_fine(
    pool: asyncpg.Pool,
    db_url: str,
    workspace: UUID,
    media_root: Path,
    whisper_fake: FakeWhisper,
    forgejo_fake: FakeForgejo,
) -> None:
    inside = str(media_root / "episodes/ep1.wav")
    job_id = await enqueue(pool, workspace, payload(audio_path=inside))
    await drain(
        pool, db_url, config=service_config(media_root, whisper=whisper_fake, forgejo=forgejo_fake)
    )
    assert (await job(pool, job_id))["status"] == "completed"


@pytest.mark.parametrize(
    "body, words",
    [
        (payload(forgejo={"owner": "o", "repo": "r", "path": "../x.srt"}), "forgejo.path"),
        (payload(language="norsk"), "language"),
        ({"transcript_ref": "ep-1"}, "audio_path"),
    ],
)
async def test_bad_payloads_fail_naming_the_field(
    pool: asyncpg.Pool,
    db_url: str,
    workspace: UUID,
    media_root: Path,
    whisper_fake: FakeWhisper,
    forgejo_fake: FakeForgejo,
    body: dict[str, Any],
    words: str,
) -> None:
    job_id = await enqueue(pool, workspace, body)
    await drain(
        pool, db_url, config=service_config(media_root, whisper=whisper_fake, forgejo=forgejo_fake)
    )
    row = await job(pool, job_id)
    assert row["status"] == "error" and words in row["error_msg"]


async def test_missing_settings_are_named(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, media_root: Path
) -> None:
    job_id = await enqueue(pool, workspace)
    await drain(pool, db_url, config=service_config(media_root))
    row = await job(pool, job_id)
    assert row["status"] == "error"
    assert row["error_msg"].startswith("WHISPER_URL, FORGEJO_URL, FORGEJO_TOKEN not set")


async def test_the_chain_writes_only_into_the_jobs_workspace(
    pool: asyncpg.Pool,
    db_url: str,
    workspace: UUID,
    media_root: Path,
    whisper_fake: FakeWhisper,
    forgejo_fake: FakeForgejo,
) -> None:
    other = await make_workspace(pool, "other")
    await enqueue(pool, workspace)
    await drain(
        pool, db_url, config=service_config(media_root, whisper=whisper_fake, forgejo=forgejo_fake)
    )
    assert (await only_follow_up(pool))["workspace_id"] == workspace
    assert await transcripts_store.get_transcript(pool, workspace, "ep-1") is not None
    assert await transcripts_store.get_transcript(pool, other, "ep-1") is None
    assert not await pool.fetchval(
        "SELECT count(*) FROM transcript_segments WHERE workspace_id = $1", other
    )


async def test_the_upload_is_streamed_in_chunks(tmp_path: Path) -> None:
    audio = tmp_path / "long.wav"
    audio.write_bytes(b"RIFF" + os.urandom(3 * CHUNK_BYTES + 123))
    seen: list[int] = []

    async def on_upload(sent: int, total: int) -> None:
        seen.append(sent)

    with audio.open("rb") as f:
        body = _Multipart({"model": "m"}, f)
        chunks = [c async for c in body.stream(on_upload)]
    assert max(len(c) for c in chunks) <= CHUNK_BYTES  # never the whole file in one piece
    assert sum(len(c) for c in chunks) == body.length
    assert seen[-1] == audio.stat().st_size and len(seen) == 4
