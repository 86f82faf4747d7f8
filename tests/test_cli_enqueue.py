"""`enqueue` of one job as a user meets it: what the printed id is, and what stderr says."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from uuid import UUID

import asyncpg
import pytest

from tests.helpers import cli, one_line_error


async def test_a_held_unique_key_says_which_job_the_printed_id_is(
    db_url: str, pool: asyncpg.Pool, workspace: UUID
) -> None:
    ws = str(workspace)
    first = cli("enqueue", "noop", "--workspace", ws, "--unique-key", "k", "--in", "1h", url=db_url)
    assert first.returncode == 0, first.stderr
    holder = first.stdout.strip()
    assert "unique key" not in first.stderr
    # The key is the workspace's, whatever the job type: this whisper job is the noop one.
    again = cli(
        "enqueue",
        "whisper_transcribe",
        "--workspace",
        ws,
        "--unique-key",
        "k",
        "--payload",
        '{"audio_path": "a.mp3"}',
        url=db_url,
    )
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == holder
    said = [ln for ln in again.stderr.splitlines() if not ln.startswith("sidelinja-worker: using")]
    assert said == [
        f"sidelinja-worker: --unique-key 'k' is held by job {holder} (noop, pending): "
        "that is the id printed; nothing new was enqueued"
    ]
    assert await pool.fetchval("SELECT count(*) FROM job_queue") == 1


async def test_the_episode_pipeline_warns_of_settings_not_set_here_as_enqueue_does(
    db_url: str, workspace: UUID
) -> None:
    whisper = ("WHISPER_URL", "MEDIA_ROOT", "FORGEJO_URL", "FORGEJO_TOKEN")
    unset = dict.fromkeys((*whisper, "AI_GATEWAY_URL", "AI_GATEWAY_KEY"), "")
    out = cli(
        "pipeline", "episode", "--workspace", str(workspace), "--audio", "ep1.mp3",
        url=db_url, env=unset,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.splitlines()) == 3  # the ids, as before
    assert "warning: whisper_transcribe needs WHISPER_URL, MEDIA_ROOT" in out.stderr
    assert "warning: openrouter_analyze needs AI_GATEWAY_URL, AI_GATEWAY_KEY" in out.stderr


def test_a_file_typed_at_the_terminal_says_how_to_end_it(db_url: str, workspace: UUID) -> None:
    controller, terminal = pty.openpty()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sidelinja_worker", "enqueue", "--file", "-", "noop"],
            env={**os.environ, "DATABASE_URL": db_url},
            stdin=terminal,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        # A line, then Ctrl-D at the start of the next: the end of the file, as a user types it.
        os.write(controller, f'{{"workspace_id": "{workspace}"}}\n'.encode() + b"\x04")
        out, err = proc.communicate(timeout=120)
    finally:
        os.close(controller)
        os.close(terminal)
    assert proc.returncode == 0, err
    assert out == "enqueued 1 job from stdin\n"
    assert "sidelinja-worker: type one JSON object per line; Ctrl-D ends the file" in err


@pytest.mark.parametrize("key", ["", "k" * 1001])
async def test_a_unique_key_is_held_to_the_bulk_lines_bounds(
    db_url: str, pool: asyncpg.Pool, workspace: UUID, key: str
) -> None:
    out = cli("enqueue", "noop", "--workspace", str(workspace), "--unique-key", key, url=db_url)
    assert out.returncode == 2
    assert one_line_error(out) == "sidelinja-worker: error: --unique-key: 1 to 1,000 characters"
    assert await pool.fetchval("SELECT count(*) FROM job_queue") == 0


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (("--audio", ""), "--audio must not be empty"),
        (("--audio", " \t"), "--audio must not be empty"),
        (("--audio", "ep1.mp3", "--language", " "), "--language must not be empty"),
        (("--audio", "ep1.mp3", "--repo", " /transcripts"), "--repo must be OWNER/REPO, got ' /transcripts'"),
        (("--audio", "ep1.mp3", "--ref", ""), "--ref must not be empty (leave it out for its default)"),
        (("--audio", "ep1.mp3", "--srt-path", " "), "--srt-path must not be empty (leave it out for its default)"),
        (("--audio", "ep1.mp3", "--branch", ""), "--branch must not be empty (leave it out for its default)"),
        (("--audio", "/"), "--audio '/' names no file to name the transcript by: give --ref"),
        (("--audio", "ep1.mp3", "--language", "english"), "--language 'english': String should match pattern '^[a-z]{2,3}$'"),
    ],
)  # fmt: skip
async def test_the_episode_pipeline_refuses_a_blank_value_and_enqueues_nothing(
    db_url: str, pool: asyncpg.Pool, workspace: UUID, flags: tuple[str, ...], said: str
) -> None:
    """A blank --audio was enqueued as a graph whose first job fails at once."""
    out = cli("pipeline", "episode", "--workspace", str(workspace), *flags, url=db_url)
    assert out.returncode == 2
    assert one_line_error(out) == f"sidelinja-worker: error: {said}"
    assert await pool.fetchval("SELECT count(*) FROM job_queue") == 0
