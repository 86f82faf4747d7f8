"""Hostile files and paths in a workspace's media folder: a job reads only its own workspace's
regular files, opened once and read from that open file, whatever is swapped, linked or
appended while it runs."""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from uuid import UUID, uuid4

import asyncpg
import pytest
import zstandard
from aiohttp import web

from sidelinja_worker.jobs.stats.counting import MAX_EPISODES, EpisodeRules
from sidelinja_worker.jobs.stats.logfiles import LogFile, read_blocks
from sidelinja_worker.jobs.stats.parse import ParseResult, parse_files
from sidelinja_worker.jobs.stats.stats_parse import plan, resolve_logs
from sidelinja_worker.queue import client
from sidelinja_worker.queue.config import ServiceConfig
from sidelinja_worker.services import livekit
from tests.fakes.fixtures import (  # noqa: F401  (pytest finds fixtures by module name)
    EPISODE_SRT,
    LIVEKIT_KEY,
    LIVEKIT_SECRET,
    forgejo_fake_fixture,
    media_root_fixture,
    service_config,
    whisper_fake_fixture,
)
from tests.fakes.forgejo_server import FakeForgejo
from tests.fakes.livekit_server import FakeLiveKit
from tests.fakes.serve import serve
from tests.fakes.whisper_server import FakeWhisper, fake_audio
from tests.helpers import run_burst
from tests.test_silos import _outcome, _workspace
from tests.test_stats_counting import line

B_SRT = "1\n00:00:01,000 --> 00:00:02,000\nHemmelig tekst fra B\n"
# srt_parse jobs run while a symlink is swapped in and out: where the checked path was opened
# again by name, one job in three to eight that read a file read the other workspace's.
JOBS = 150


async def _two_workspaces(pool: asyncpg.Pool, tmp_path: Path) -> tuple[UUID, Path, Path]:
    """Workspace A's id, MEDIA_ROOT, and B's file `secret.srt` in B's media folder."""
    a, b = await _workspace(pool, "a"), await _workspace(pool, "b")
    root = tmp_path / "media"
    (root / str(a)).mkdir(parents=True)
    (root / str(b)).mkdir(parents=True)
    b_file = root / str(b) / "secret.srt"
    b_file.write_text(B_SRT, "utf-8")
    return a, root, b_file


async def test_a_hard_link_to_another_workspaces_file_is_refused(
    pool: asyncpg.Pool, db_url: str, tmp_path: Path
) -> None:
    a, root, b_file = await _two_workspaces(pool, tmp_path)
    os.link(b_file, root / str(a) / "ep.srt")  # inside A's folder by every path check
    job = await client.enqueue(pool, a, "srt_parse", {"transcript_ref": "x", "srt_path": "ep.srt"})
    await run_burst(pool, db_url, config=ServiceConfig({"MEDIA_ROOT": str(root)}))
    status, attempts, error = await _outcome(pool, job)
    assert (status, attempts) == ("error", 1), error
    assert error is not None and "has 2 links" in error
    assert await pool.fetchval("SELECT count(*) FROM transcripts WHERE workspace_id = $1", a) == 0


SWAPPER = """
import os, sys
target, own, other = sys.argv[1:]
file_tmp, link_tmp = target + ".f", target + ".l"
print("swapping", flush=True)
while True:
    with open(file_tmp, "w") as f:
        f.write(own)
    os.replace(file_tmp, target)
    os.symlink(other, link_tmp)
    os.replace(link_tmp, target)
"""


async def test_a_symlink_swapped_in_after_the_check_is_never_followed(
    pool: asyncpg.Pool, db_url: str, tmp_path: Path
) -> None:
    # Another process swaps A's SRT for a symlink to B's and back, as fast as it can: each job
    # reads A's file or is refused, and never stores B's words.
    a, root, b_file = await _two_workspaces(pool, tmp_path)
    target = root / str(a) / "ep.srt"
    swapper = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        SWAPPER,
        str(target),
        EPISODE_SRT,
        str(b_file),
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert swapper.stdout is not None and await swapper.stdout.readline() == b"swapping\n"
        for i in range(JOBS):
            body = {"transcript_ref": f"x{i}", "srt_path": "ep.srt"}
            await client.enqueue(pool, a, "srt_parse", body, max_attempts=1)
        await run_burst(pool, db_url, config=ServiceConfig({"MEDIA_ROOT": str(root)}))
    finally:
        swapper.kill()
        await swapper.wait()
    texts = await pool.fetch("SELECT plain_text FROM transcripts WHERE workspace_id = $1", a)
    assert texts, "no job read the file: the swaps never left it in place"
    assert sum("Hemmelig" in r["plain_text"] for r in texts) == 0, f"{len(texts)} stored"


def test_a_log_swapped_for_a_symlink_after_listing_is_not_read(tmp_path: Path) -> None:
    # The logs are listed (and checked) in the worker, then read in a child process a database
    # round trip or two later: a name swapped in between for a symlink out of the folder must
    # not be followed.
    a, b = tmp_path / "a", tmp_path / "b"
    (a / "logs").mkdir(parents=True)
    b.mkdir()
    own = a / "logs" / "access.log"
    own.write_bytes(line(ip="198.51.100.1"))
    (b / "access.log").write_bytes(line(ip="203.0.113.66") * 3)
    logs = resolve_logs(a, "logs")
    tasks, _ = plan(logs, {log: "fp" for log in logs}, {})
    os.replace(_symlink(tmp_path, b / "access.log"), own)
    result = parse_files(tasks, EpisodeRules())
    assert result.listens == {} and result.counted_requests == 0
    assert result.errors == ["access.log: UnsafeFile: leads out of its folder: refused"]


def test_a_log_swapped_for_a_named_pipe_after_listing_is_refused_at_once(tmp_path: Path) -> None:
    # Opening a named pipe waits for a writer: the parse's child process waited out the job's
    # hour, and a fingerprint's thread waited for good.
    logs = tmp_path / "logs"
    logs.mkdir()
    rotated = logs / "access-2026-03-01T00-00-00.000.log"
    rotated.write_bytes(line())
    listed = resolve_logs(tmp_path, "logs")
    tasks, _ = plan(listed, {log: "fp" for log in listed}, {})
    fifo = logs / "swap.tmp"
    os.mkfifo(fifo)
    os.replace(fifo, rotated)
    done = threading.Event()
    results: list[ParseResult] = []

    def parse() -> None:
        results.append(parse_files(tasks, EpisodeRules()))
        done.set()

    thread = threading.Thread(target=parse, daemon=True)
    thread.start()
    finished = done.wait(30)
    if not finished:  # let the blocked open go, so the thread ends
        os.close(os.open(rotated, os.O_WRONLY))
        thread.join()
    assert finished, "the parse waited on the named pipe"
    assert results[0].errors == [f"{rotated.name}: UnsafeFile: is not a regular file: refused"]


def test_a_live_log_is_read_up_to_the_size_it_had_when_opened(tmp_path: Path) -> None:
    # Caddy appends to the live log while a run reads it; a log that grows faster than the
    # parse reads would keep one run going (and its offsets uncommitted) for good. A run reads
    # what was there when it opened the file; the next run reads on from there.
    live = tmp_path / "access.log"
    first = line(ip="198.51.100.1") * 1000
    live.write_bytes(first)
    blocks = 0
    with live.open("ab") as writer:
        for _, offset in read_blocks(LogFile(live, rotated=False), 0):  # noqa: B007 - the last is kept
            blocks += 1
            writer.write(line(ip="198.51.100.2") * 300)  # more than a block, every block
            writer.flush()
            assert blocks < 1000, "the run never reached the end of the log"
    assert offset == len(first)


def _symlink(folder: Path, target: Path) -> Path:
    link = folder / "swap.tmp"
    link.symlink_to(target)
    return link


# The parse in a process of its own, printing its peak memory (VmHWM: getrusage's ru_maxrss
# keeps the high-water mark of the process that forked it, here pytest's).
PEAK_RSS = """
import re, sys
from pathlib import Path
from sidelinja_worker.jobs.stats.counting import EpisodeRules
from sidelinja_worker.jobs.stats.parse import FileTask, parse_files
result = parse_files([FileTask(Path(sys.argv[1]), True, "fp", 0)], EpisodeRules())
peak_kb = re.search(r"VmHWM:\\s+(\\d+)", Path("/proc/self/status").read_text())[1]
print(int(peak_kb) // 1024, result.lines, result.errors)
"""


def test_a_zstd_frame_that_needs_a_huge_window_is_refused(tmp_path: Path) -> None:
    # A zstd frame names the window its decoder keeps (up to 128 MiB by libzstd's default), and
    # the decoder fills it: 96 MB of text some 40 times smaller compressed (well inside the
    # bomb limit) held the parse at 116 MB; in 8 MiB windows (Caddy's, zstd's levels 1-19)
    # the same text peaks at 31 MB. Such a frame is now refused at its header (22 MB).
    rows = random.Random(7)
    block = b"".join(b'{"x":"%032x"}\n' % rows.getrandbits(128) for _ in range(150_000))
    params = zstandard.ZstdCompressionParameters.from_level(
        1, window_log=27, enable_ldm=True, write_content_size=False
    )
    path = tmp_path / "access-2026-03-01T00-00-00.000-size.log.zst"
    with (
        path.open("wb") as out,
        zstandard.ZstdCompressor(compression_params=params).stream_writer(out) as w,
    ):
        for _ in range(16):
            w.write(block)
    done = subprocess.run(
        [sys.executable, "-c", PEAK_RSS, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
    )
    peak_mb, lines, errors = done.stdout.split(" ", 2)
    assert int(peak_mb) < 64, f"{peak_mb} MB peak for {lines} lines"
    assert "ZstdError" in errors and "too much memory" in errors


async def test_symlinks_that_stay_inside_the_folder_are_still_followed(
    pool: asyncpg.Pool, db_url: str, tmp_path: Path
) -> None:
    # A checked path is opened along its resolved steps: a symlinked folder or file inside the
    # workspace's folder reads as before.
    a, root, _ = await _two_workspaces(pool, tmp_path)
    (root / str(a) / "archive" / "2026").mkdir(parents=True)
    (root / str(a) / "archive" / "2026" / "ep.srt").write_text(EPISODE_SRT, "utf-8")
    (root / str(a) / "srt").symlink_to(root / str(a) / "archive" / "2026")
    (root / str(a) / "latest.srt").symlink_to("srt/ep.srt")
    jobs = [
        await client.enqueue(pool, a, "srt_parse", {"transcript_ref": ref, "srt_path": path})
        for ref, path in (("via-folder", "srt/ep.srt"), ("via-file", "latest.srt"))
    ]
    await run_burst(pool, db_url, config=ServiceConfig({"MEDIA_ROOT": str(root)}))
    assert [(await _outcome(pool, job))[0] for job in jobs] == ["completed", "completed"]


async def test_a_path_through_a_symlink_loop_fails_at_once_naming_it(
    pool: asyncpg.Pool,
    db_url: str,
    workspace: UUID,
    media_root: Path,
    whisper_fake: FakeWhisper,
    forgejo_fake: FakeForgejo,
) -> None:
    # Python 3.11 resolves a loop with RuntimeError, which the path checks did not catch: the
    # job failed as transient and was tried again, to the same loop.
    (media_root / "loop").symlink_to(media_root / "loop")
    srt = await client.enqueue(
        pool, workspace, "srt_parse", {"transcript_ref": "x", "srt_path": "loop/ep.srt"}
    )
    target = {"owner": "sidelinja", "repo": "transcripts", "path": "ep.srt"}
    body = {"audio_path": "loop/ep.wav", "transcript_ref": "x", "forgejo": target}
    audio = await client.enqueue(pool, workspace, "whisper_transcribe", body)
    config = service_config(media_root, whisper=whisper_fake, forgejo=forgejo_fake)
    await run_burst(pool, db_url, config=config)
    for job, path in ((srt, "loop/ep.srt"), (audio, "loop/ep.wav")):
        status, attempts, error = await _outcome(pool, job)
        assert (status, attempts) == ("error", 1), error
        assert error is not None and error.startswith(f"path {path!r} cannot be resolved")
    assert not whisper_fake.uploads


# A parse of `sys.argv[2]` lines, each a 200 for a path of its own under the episode prefix (a
# site whose catch-all answers 200 to any path makes them from any client's requests), in a
# process of its own, spilling as the job does; its peak memory past its start, and what it
# found.
EPISODE_FLOOD = """
import re, sys
from pathlib import Path
from sidelinja_worker.jobs.stats.counting import EpisodeRules
from sidelinja_worker.jobs.stats.parse import FileTask, parse_files
folder = Path(sys.argv[1])
log = folder / "access-2026-03-01T00-00-00.000.log"
entry = ('{"ts":1772330000.5,"request":{"client_ip":"198.51.100.7","method":"GET",'
         '"uri":"/podcast/x%d.mp3","headers":{"User-Agent":["Spotify/8.9.30 iOS/17.4"]}},'
         '"size":1000,"status":200,"resp_headers":{"Content-Length":["1000"]}}\\n')
with log.open("w") as out:
    out.writelines(entry % i for i in range(int(sys.argv[2])))
def memory(field):
    return int(re.search(field + r":\\s+(\\d+)", Path("/proc/self/status").read_text())[1])
before = memory("VmRSS")
(folder / "spill").mkdir()
result = parse_files([FileTask(log, True, "fp", 0)], EpisodeRules(), folder / "spill", 100_000)
print((memory("VmHWM") - before) // 1024, len(result.episodes), result.errors)
"""


def test_a_flood_of_paths_under_the_episode_prefix_is_bounded(tmp_path: Path) -> None:
    # Listeners spill to files; the episodes (their sizes, paths and thresholds) did not: a
    # million of them held the parse at 243 MB past its start, and each went on to the worker
    # (a media file looked up, a threshold, a row of downloads).
    done = subprocess.run(
        [sys.executable, "-c", EPISODE_FLOOD, str(tmp_path), "1000000"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
    )
    peak_mb, episodes, errors = done.stdout.strip().split(" ", 2)
    assert int(peak_mb) < 100, f"{peak_mb} MB past the start for {episodes} episodes"
    assert int(episodes) == MAX_EPISODES
    assert f"more than {MAX_EPISODES:,} episodes in one run" in errors


@dataclass
class SwappingLiveKit(FakeLiveKit):
    """A LiveKit that runs `swap` when the room list is first asked for: whisper_transcribe asks
    it (its governor) after it checks the audio file and before the upload."""

    swap: Callable[[], None] | None = None

    async def list_rooms(self, request: web.Request) -> web.Response:
        if self.swap is not None:
            self.swap()
            self.swap = None
        return await super().list_rooms(request)


@pytest.fixture(name="swapping_livekit")
async def swapping_livekit_fixture() -> AsyncIterator[SwappingLiveKit]:
    livekit.clear_cache()  # a room list cached by an earlier test would skip the swap
    fake = SwappingLiveKit(api_key=LIVEKIT_KEY, api_secret=LIVEKIT_SECRET)
    async with serve(fake.app()) as url:
        fake.url = url
        yield fake
    livekit.clear_cache()


def _swap_in(target: Path, make: Callable[[Path], None]) -> Callable[[], None]:
    """A swap of `target` for what `make` puts at a name beside it, in one rename."""

    def swap() -> None:
        spare = target.with_name("swap.tmp")
        make(spare)
        os.replace(spare, target)

    return swap


def _symlink_to_another_workspaces_audio(at: Path) -> None:
    other = at.parents[2] / str(uuid4())  # MEDIA_ROOT/<another workspace>
    other.mkdir()
    (other / "interview.wav").write_bytes(fake_audio(3))
    at.symlink_to(other / "interview.wav")


@pytest.mark.parametrize("make", [_symlink_to_another_workspaces_audio, os.mkfifo])
async def test_audio_swapped_after_the_check_is_never_what_is_uploaded(
    pool: asyncpg.Pool,
    db_url: str,
    workspace: UUID,
    media_root: Path,
    whisper_fake: FakeWhisper,
    forgejo_fake: FakeForgejo,
    swapping_livekit: SwappingLiveKit,
    make: Callable[[Path], None],
) -> None:
    # The upload opened the audio file again by name, on the event loop, after the governor
    # asked LiveKit: a symlink swapped in then sent another workspace's audio to whisper, and a
    # named pipe held the whole worker until a writer came (then sent nothing).
    own = media_root / "episodes" / "ep1.wav"
    own_sha = hashlib.sha256(own.read_bytes()).hexdigest()
    swapping_livekit.swap = _swap_in(own, make)
    finished, released = threading.Event(), threading.Event()

    def release() -> None:  # a loop blocked opening a pipe gets a writer, so the test ends
        if finished.wait(30):
            return
        released.set()
        try:  # without a reader waiting, a non-blocking open fails rather than waits
            os.close(os.open(own, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass

    watchdog = threading.Thread(target=release, daemon=True)
    watchdog.start()
    target = {"owner": "sidelinja", "repo": "transcripts", "path": "ep1.srt"}
    body = {"audio_path": "episodes/ep1.wav", "transcript_ref": "ep1", "forgejo": target}
    job = await client.enqueue(pool, workspace, "whisper_transcribe", body, max_attempts=1)
    config = service_config(
        media_root, whisper=whisper_fake, forgejo=forgejo_fake, livekit_fake=swapping_livekit
    )
    try:
        await run_burst(pool, db_url, config=config)
    finally:
        finished.set()
        watchdog.join()
    assert swapping_livekit.swap is None, "LiveKit was not asked: nothing was swapped"
    assert not released.is_set(), "the event loop waited on the named pipe"
    assert [u.sha256 for u in whisper_fake.uploads] == [own_sha]
    status, _, error = await _outcome(pool, job)
    assert status == "completed", error
