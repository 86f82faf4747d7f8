"""`enqueue` of one job as a user meets it: what the printed id is, and what stderr says."""

from __future__ import annotations

from uuid import UUID

import asyncpg

from tests.helpers import cli


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
