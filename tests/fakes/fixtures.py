"""pytest fixtures for the fake services. A test module imports the `*_fixture` functions it uses;
the fixtures go by the short names (`whisper_fake`…), which tests take as parameters."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from uuid import UUID

import asyncpg
import pytest

from sidelinja_worker.queue.config import ServiceConfig
from sidelinja_worker.services import livekit
from tests.fakes.forgejo_server import FakeForgejo, Repo
from tests.fakes.livekit_server import FakeLiveKit
from tests.fakes.serve import serve
from tests.fakes.whisper_server import FakeWhisper, fake_audio

DATA = Path(__file__).resolve().parent.parent / "data"
EPISODE_SRT = (DATA / "episode.srt").read_text("utf-8")
# Secret values the tests look for in every error_msg and result.
FORGEJO_TOKEN = "fj-write-7c1d0e-SECRET"
FORGEJO_READ_TOKEN = "fj-read-99aa11-SECRET"
LIVEKIT_KEY = "APIlkKey123"
LIVEKIT_SECRET = "lk-secret-5f2b9a-long-enough-for-hs256-SECRET"
WHISPER_KEY = "whisper-key-0b3c-SECRET"
SECRETS = (FORGEJO_TOKEN, FORGEJO_READ_TOKEN, LIVEKIT_SECRET, WHISPER_KEY)


@pytest.fixture(name="media_root")
def media_root_fixture(tmp_path: Path, workspace: UUID) -> Path:
    """The test workspace's own media folder, MEDIA_ROOT/<workspace id>; `service_config`
    points MEDIA_ROOT at its parent."""
    root = tmp_path / "media" / str(workspace)
    (root / "episodes").mkdir(parents=True)
    (root / "episodes" / "ep1.wav").write_bytes(fake_audio(2))
    (root / "srt").mkdir()
    (root / "srt" / "episode.srt").write_text(EPISODE_SRT, "utf-8")
    return root


@pytest.fixture(name="whisper_fake")
async def whisper_fake_fixture() -> AsyncIterator[FakeWhisper]:
    fake = FakeWhisper(srt=EPISODE_SRT)
    async with serve(fake.app()) as url:
        fake.url = url
        yield fake


@pytest.fixture(name="governed_whisper_fake")
async def governed_whisper_fake_fixture() -> AsyncIterator[FakeWhisper]:
    fake = FakeWhisper(srt=EPISODE_SRT)
    async with serve(fake.app()) as url:
        fake.url = url
        yield fake


async def allow_repos(pool: asyncpg.Pool, workspace: UUID, *repos: str) -> None:
    """Adds `repos` to the workspace's `forgejo.repos` setting (its other settings kept)."""
    await pool.execute(
        "UPDATE workspaces SET settings = settings || jsonb_build_object('forgejo', "
        "jsonb_build_object('repos', $2::text[])) WHERE id = $1",
        workspace,
        list(repos),
    )


async def allow_models(pool: asyncpg.Pool, workspace: UUID, *models: str) -> None:
    """Sets the workspace's `ai.models` setting to `models` (its other settings kept)."""
    await pool.execute(
        "UPDATE workspaces SET settings = settings || jsonb_build_object('ai', "
        "coalesce(settings->'ai', '{}') || jsonb_build_object('models', $2::text[])) "
        "WHERE id = $1",
        workspace,
        list(models),
    )


@pytest.fixture(name="forgejo_fake")
async def forgejo_fake_fixture(pool: asyncpg.Pool, workspace: UUID) -> AsyncIterator[FakeForgejo]:
    await allow_repos(pool, workspace, "sidelinja/transcripts")  # the fake's repository
    fake = FakeForgejo(
        tokens={FORGEJO_TOKEN: "write", FORGEJO_READ_TOKEN: "read"},
        repos={("sidelinja", "transcripts"): Repo()},
    )
    async with serve(fake.app()) as url:
        fake.url = url
        yield fake


@pytest.fixture(name="livekit_fake")
async def livekit_fake_fixture() -> AsyncIterator[FakeLiveKit]:
    livekit.clear_cache()  # a room list cached by an earlier test must not leak in
    fake = FakeLiveKit(api_key=LIVEKIT_KEY, api_secret=LIVEKIT_SECRET)
    async with serve(fake.app()) as url:
        fake.url = url
        yield fake
    livekit.clear_cache()


def service_config(
    media_root: Path | None = None,
    *,
    whisper: FakeWhisper | None = None,
    forgejo: FakeForgejo | None = None,
    livekit_fake: FakeLiveKit | None = None,
    governed: FakeWhisper | None = None,
    **extra: str,
) -> ServiceConfig:
    """The settings pointing at the running fakes, plus `extra` overrides."""
    values: dict[str, str] = {}
    if media_root is not None:  # a workspace's folder (the `media_root` fixture)
        values["MEDIA_ROOT"] = str(media_root.parent)
    if whisper is not None:
        values["WHISPER_URL"] = whisper.url
    if governed is not None:
        values["WHISPER_GOVERNED_URL"] = governed.url
    if forgejo is not None:
        values.update(FORGEJO_URL=forgejo.url, FORGEJO_TOKEN=FORGEJO_TOKEN)
    if livekit_fake is not None:
        values.update(
            LIVEKIT_URL=livekit_fake.url.replace("http://", "ws://"),
            LIVEKIT_API_KEY=LIVEKIT_KEY,
            LIVEKIT_API_SECRET=LIVEKIT_SECRET,
        )
    values.update(extra)
    return ServiceConfig({k: v for k, v in values.items() if v})
