"""srt_parse: SRT edge cases, malformed input named by line, atomic replacement, workspace
isolation, and reading the SRT from a file under MEDIA_ROOT or from Forgejo."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import Any
from uuid import UUID

import asyncpg
import pytest

from sidelinja_worker.jobs.transcripts import srt_parse
from sidelinja_worker.jobs.transcripts import store as transcripts_store
from sidelinja_worker.jobs.transcripts.subtitles import (
    Segment,
    SrtError,
    Transcript,
    parse_srt,
)
from sidelinja_worker.queue import client, executor
from tests.fakes.fixtures import (  # noqa: F401  (pytest finds fixtures by module name)
    EPISODE_SRT,
    forgejo_fake_fixture,
    media_root_fixture,
    service_config,
)
from tests.fakes.forgejo_server import FakeForgejo
from tests.fakes.stalls import longest_stall
from tests.helpers import make_workspace, run_burst

TWO_CUES = (
    "1\n00:00:01,000 --> 00:00:02,000\nNy versjon.\n\n"
    "2\n00:00:02,000 --> 00:00:03,500\nTo linjer.\n"
)


async def parse_job(
    pool: asyncpg.Pool,
    db_url: str,
    workspace: UUID,
    body: dict[str, Any],
    media_root: Path | None,
    forgejo: FakeForgejo | None = None,
) -> asyncpg.Record:
    body = {"transcript_ref": "ep-1", **body}
    job_id = await client.enqueue(pool, workspace, "srt_parse", body)
    await run_burst(pool, db_url, config=service_config(media_root, forgejo=forgejo))
    return await pool.fetchrow("SELECT * FROM job_queue WHERE id = $1", job_id)


async def test_the_sample_episode_is_stored_with_plain_text_and_webvtt(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, media_root: Path
) -> None:
    body = {"srt_path": "srt/episode.srt", "language": "no"}
    row = await parse_job(pool, db_url, workspace, body, media_root)
    assert row["status"] == "completed", row["error_msg"]
    assert row["result"] == {
        "transcript_ref": "ep-1",
        "segments": 10,
        "duration_ms": 43_900,
        "characters": row["result"]["characters"],
        "source": {"path": "srt/episode.srt"},
    }
    t = await transcripts_store.get_transcript(pool, workspace, "ep-1")
    assert t is not None
    assert (t["segment_count"], t["language"], t["job_id"]) == (10, "no", row["id"])
    first, second = t["plain_text"].split("\n\n")  # a 2.4 s pause starts a new paragraph
    assert first.startswith(
        "Hei, og velkommen til Sidelinja. Jeg heter Ingrid, og med meg i studio i dag"
    )
    assert second.startswith("La oss begynne med tallene fra Medietilsynet,")
    assert t["webvtt"].startswith("WEBVTT\n\n1\n00:00:00.000 --> 00:00:03.480\nHei, og velkommen")
    segs = await transcripts_store.get_segments(pool, workspace, "ep-1")
    assert [s["seq"] for s in segs] == list(range(1, 11))
    assert (segs[1]["start_ms"], segs[1]["end_ms"]) == (3480, 7920)
    assert segs[1]["text"] == "Jeg heter Ingrid, og med meg i studio\ni dag har jeg Øystein."
    assert segs[7]["text"] == "Særlig i Nord-Norge og på Vestlandet."  # <i> removed


@pytest.mark.parametrize(
    "text",
    [
        "\ufeff1\n00:00:01,000 --> 00:00:02,000\nHei\n\n2\n00:00:03,000 --> 00:00:04,500\nHallo\n",
        (
            "1\r\n00:00:01,000 --> 00:00:02,000\r\nHei\r\n\r\n"
            "2\r\n00:00:03,000 --> 00:00:04,500\r\nHallo\r\n"
        ),
        "1\r00:00:01,000 --> 00:00:02,000\rHei\r\r2\r00:00:03,000 --> 00:00:04,500\rHallo",
        "1\n00:00:01,000 --> 00:00:02,000\nHei\n\n2\n00:00:03,000 --> 00:00:04,500\nHallo",
        (
            "\n\n1\n00:00:01,000 --> 00:00:02,000\n<i>Hei</i>\n\n\n\n2\n00:00:03,000 --> 00:00:04,500\n"
            '<font color="#ffff00">Hallo</font>\n'
        ),
        (
            "1\n00:00:01,000 --> 00:00:02,000\n{\\an8}Hei\n\n"
            "2\n00:00:03.000 --> 00:00:04.500\n<b>Hal</b>lo\n"
        ),
        (
            "1\n00:00:01,000 --> 00:00:02,000\nHei\n\n2\n00:00:02,500 --> 00:00:02,900\n<i></i>\n\n"
            "3\n00:00:03,000 --> 00:00:04,500\nHallo\n"
        ),  # a cue that is only markup is dropped
    ],
)
def test_tolerated_variants_parse_to_the_same_segments(text: str) -> None:
    assert parse_srt(text).segments == (Segment(1000, 2000, "Hei"), Segment(3000, 4500, "Hallo"))


def test_multi_line_cues_keep_their_lines_and_entities_are_decoded() -> None:
    t = parse_srt("1\n00:00:01,000 --> 00:00:02,000\n- Hei &amp; hallo\n-  Hei  igjen\n")
    assert t.segments[0].text == "- Hei & hallo\n- Hei igjen"
    assert t.plain_text == "- Hei & hallo - Hei igjen"
    assert "- Hei &amp; hallo\n- Hei igjen" in t.webvtt  # escaped again for WebVTT


def test_an_empty_srt_is_an_empty_transcript() -> None:
    assert parse_srt("\ufeff \n\n").segments == ()


CUE1 = "1\n00:00:01,000 --> 00:00:02,000\nHei\n\n"


@pytest.mark.parametrize(
    "text, line, words",
    [
        ("hei\n", 1, "expected a cue number and timing line, got 'hei'"),
        (
            "1\n00:00:01,000 --> 00:0x:02,000\nHei\n",
            2,
            "a letter 'x' inside the timestamp '00:0x:02,000' of '00:00:01,000 --> 00:0x:02,000'",
        ),
        (
            CUE1 + "2\nHallo\n",
            6,
            "expected a timing line after the cue number, got 'Hallo'",
        ),
        (
            "1\r\n00:00:01,000 --> 00:00:02,000\r\nHei\r\n\r\n2\r\n00:00:05,000 --> 00:00:03,000\r\nx\r\n",
            6,
            "the cue ends (00:00:03,000) before it starts (00:00:05,000)",
        ),
        (
            CUE1 + "stray\n00:00:03,000 -> 00:00:04,000\nx\n",
            6,
            "wrong arrow '->' in timing line '00:00:03,000 -> 00:00:04,000' (expected '-->')",
        ),
        # The first bad line is named even when a later one is also bad: a letter in a
        # timestamp is not read as a cue that ends before it starts.
        (
            CUE1 + "2\n00:00:O3,000 --> 00:00:04,000\nx\n\n3\n00:00:09,000 -> 00:00:08,000\ny\n",
            6,
            "a letter 'O' inside the timestamp '00:00:O3,000'",
        ),
        (
            CUE1 + "2\n00:00:03,000 => 00:00:04,000\nx\n",
            6,
            "wrong arrow '=>' in timing line",
        ),
        (CUE1 + "2\n\nx\n", 6, "a timing line is missing after the cue number"),
        (CUE1 + "2\n", 5, "the file ends after the cue number, without its timing line"),
        (
            CUE1 + "2\n00:00:03,000 00:00:04,000\nx\n",
            6,
            "expected a timing line after the cue number, got '00:00:03,000 00:00:04,000'",
        ),
        (
            CUE1 + "2\n00:03 --> 00:00:04,000\nx\n",
            6,
            "bad timestamp '00:03' in timing line '00:03 --> 00:00:04,000'",
        ),
        (CUE1 + "2\n00:00:03,000 --> 00:00:04,000\nx\x00y\n", 7, "a NUL character: not text"),
        (
            "1\n00:00:01,000 --> 00:00:02,000\n" + "a" * 20_001 + "\n",
            3,
            "the line is 20001 characters long (at most 20000)",
        ),
        (  # int() refuses 4,300 digits with a plain ValueError
            CUE1 + "2\n00:00:03,000 --> " + "9" * 5000 + ":00:04,000\nx\n",
            6,
            "a number of 5000 digits in the timestamp '99999999999999999999",
        ),
        (CUE1 + "2\n00:00:03,0000000000 --> 00:00:04,000\nx\n", 6, "10 digits"),
    ],
)
def test_malformed_srt_names_the_line(text: str, line: int, words: str) -> None:
    with pytest.raises(SrtError) as caught:
        parse_srt(text)
    assert caught.value.line == line
    assert str(caught.value).startswith(f"malformed SRT at line {line}: ")
    assert words in str(caught.value)


def test_a_cue_without_a_number_and_a_missing_blank_line_are_tolerated() -> None:
    text = "00:00:01,000 --> 00:00:02,000\nHei\n2\n00:00:03,000 --> 00:00:04,500\nHallo\n"
    assert parse_srt(text).segments == (Segment(1000, 2000, "Hei"), Segment(3000, 4500, "Hallo"))


def test_fraction_digits_and_fullwidth_delimiters_read_as_players_do() -> None:
    text = "1\n00:00:01.5 --> 00:01:02\uff0c250\nHei\n"
    assert parse_srt(text).segments == (Segment(1005, 62250, "Hei"),)


async def test_a_malformed_srt_fails_the_job_at_once_naming_the_line(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, media_root: Path
) -> None:
    bad = "1\n00:00:01,000 --> 00:00:02,000\nHei\n\n2\nHallo\n"
    (media_root / "srt" / "bad.srt").write_text(bad)
    row = await parse_job(pool, db_url, workspace, {"srt_path": "srt/bad.srt"}, media_root)
    assert (row["status"], row["attempts"]) == ("error", 1)
    assert row["error_msg"] == (
        "malformed SRT at line 6: expected a timing line after the cue number, got 'Hallo'"
    )


async def test_a_re_parse_replaces_the_earlier_one_and_a_failed_one_changes_nothing(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, media_root: Path
) -> None:
    await parse_job(pool, db_url, workspace, {"srt_path": "srt/episode.srt"}, media_root)
    (media_root / "srt" / "episode.srt").write_text(TWO_CUES)
    await parse_job(pool, db_url, workspace, {"srt_path": "srt/episode.srt"}, media_root)
    segs = await transcripts_store.get_segments(pool, workspace, "ep-1")
    assert [s["text"] for s in segs] == ["Ny versjon.", "To linjer."]

    (media_root / "srt" / "episode.srt").write_text("1\nbroken\n")
    row = await parse_job(pool, db_url, workspace, {"srt_path": "srt/episode.srt"}, media_root)
    assert row["status"] == "error"
    t = await transcripts_store.get_transcript(pool, workspace, "ep-1")
    assert t is not None and t["plain_text"] == "Ny versjon. To linjer."
    assert len(await transcripts_store.get_segments(pool, workspace, "ep-1")) == 2


async def test_the_replacement_is_one_transaction(pool: asyncpg.Pool, workspace: UUID) -> None:
    good = parse_srt(EPISODE_SRT)
    await transcripts_store.replace_transcript(
        pool, workspace, "ep-1", good, language="no", source={}, job_id=None
    )
    # A segment the schema refuses, after the transcript row and the delete have run.
    broken = Transcript((Segment(0, 1000, "ok"), Segment(5000, 2000, "backwards")))
    with pytest.raises(asyncpg.CheckViolationError):
        await transcripts_store.replace_transcript(
            pool, workspace, "ep-1", broken, language="nn", source={}, job_id=None
        )
    t = await transcripts_store.get_transcript(pool, workspace, "ep-1")
    assert t is not None and (t["language"], t["segment_count"]) == ("no", 10)
    assert len(await transcripts_store.get_segments(pool, workspace, "ep-1")) == 10


async def test_a_job_writes_only_into_its_own_workspace(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, media_root: Path
) -> None:
    other = await make_workspace(pool, "other")
    (media_root.parent / str(other) / "srt").mkdir(parents=True)
    (media_root.parent / str(other) / "srt" / "two.srt").write_text(TWO_CUES)
    await parse_job(pool, db_url, other, {"srt_path": "srt/two.srt"}, media_root)
    await parse_job(pool, db_url, workspace, {"srt_path": "srt/episode.srt"}, media_root)
    assert len(await transcripts_store.get_segments(pool, workspace, "ep-1")) == 10
    other_segs = await transcripts_store.get_segments(pool, other, "ep-1")
    assert [s["text"] for s in other_segs] == ["Ny versjon.", "To linjer."]
    t = await transcripts_store.get_transcript(pool, other, "ep-1")
    assert t is not None and t["segment_count"] == 2


async def test_an_srt_is_read_from_forgejo_at_the_given_commit(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, forgejo_fake: FakeForgejo
) -> None:
    sha = forgejo_fake.commit("sidelinja", "transcripts", "main", "ep/1.srt", EPISODE_SRT.encode())
    forgejo_fake.commit("sidelinja", "transcripts", "main", "ep/1.srt", TWO_CUES.encode())
    source = {"owner": "sidelinja", "repo": "transcripts", "path": "ep/1.srt", "ref": sha}
    row = await parse_job(pool, db_url, workspace, {"forgejo": source}, None, forgejo_fake)
    assert row["status"] == "completed", row["error_msg"]
    assert row["result"]["segments"] == 10  # the pinned commit, not the branch's newer file
    assert row["result"]["source"]["forgejo"]["ref"] == sha
    assert forgejo_fake.calls[0].query == {"ref": sha}


@pytest.mark.parametrize(
    "body, words",
    [
        (
            {"forgejo": {"owner": "sidelinja", "repo": "transcripts", "path": "nope.srt"}},
            "Forgejo has no file sidelinja/transcripts/nope.srt",
        ),
        ({"srt_path": "../../etc/passwd"}, "is outside this workspace's media folder"),
        ({"srt_path": "srt/missing.srt"}, "not found in this workspace's media folder"),
        ({}, "invalid payload: (payload): Value error, give exactly one of srt_path or forgejo"),
        (
            {
                "srt_path": "srt/episode.srt",
                "forgejo": {"owner": "o", "repo": "r", "path": "p.srt"},
            },
            "give exactly one of srt_path or forgejo",
        ),
    ],
)
async def test_bad_sources_fail_permanently(
    pool: asyncpg.Pool,
    db_url: str,
    workspace: UUID,
    media_root: Path,
    forgejo_fake: FakeForgejo,
    body: dict[str, Any],
    words: str,
) -> None:
    row = await parse_job(pool, db_url, workspace, body, media_root, forgejo_fake)
    assert (row["status"], row["attempts"]) == ("error", 1)
    assert words in row["error_msg"]


@pytest.mark.parametrize(
    "body, missing",
    [
        ({"srt_path": "srt/episode.srt"}, "MEDIA_ROOT"),
        ({"forgejo": {"owner": "o", "repo": "r", "path": "p.srt"}}, "FORGEJO_URL"),
    ],
)
async def test_a_missing_setting_is_named(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, body: dict[str, Any], missing: str
) -> None:
    row = await parse_job(pool, db_url, workspace, body, None)
    assert row["status"] == "error" and row["error_msg"].startswith(f"{missing} is not set")


async def test_windows_1252_files_are_read(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, media_root: Path
) -> None:
    (media_root / "srt" / "old.srt").write_bytes(
        "1\r\n00:00:01,000 --> 00:00:02,000\r\nBlåbærsyltetøy\r\n".encode("cp1252")
    )
    row = await parse_job(pool, db_url, workspace, {"srt_path": "srt/old.srt"}, media_root)
    assert row["status"] == "completed", row["error_msg"]
    segs = await transcripts_store.get_segments(pool, workspace, "ep-1")
    assert segs[0]["text"] == "Blåbærsyltetøy"


async def test_a_utf_8_file_with_one_stray_byte_stays_utf_8(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, media_root: Path
) -> None:
    """One Latin-1 "é" pasted into a UTF-8 file made the whole file Windows-1252: every æ, ø
    and å of every cue was stored as mojibake ("BlÃ¥bÃ¦rsyltetÃ¸y"), and the job completed.
    The stray byte alone is lost."""
    srt = "1\n00:00:01,000 --> 00:00:02,000\nBlåbærsyltetøy på søndag.\n\n"
    srt += "2\n00:00:03,000 --> 00:00:04,000\nKaf\x00en er åpen.\n"
    (media_root / "srt" / "mixed.srt").write_bytes(srt.encode().replace(b"\x00", b"\xe9"))
    row = await parse_job(pool, db_url, workspace, {"srt_path": "srt/mixed.srt"}, media_root)
    assert row["status"] == "completed", row["error_msg"]
    segs = await transcripts_store.get_segments(pool, workspace, "ep-1")
    assert [s["text"] for s in segs] == ["Blåbærsyltetøy på søndag.", "Kaf\ufffden er åpen."]


def test_the_demo_ships_the_sample_episode() -> None:
    demo_file = resources.files("sidelinja_worker.cli").joinpath("demo_data/episode_no.srt")
    demo = demo_file.read_text("utf-8")
    assert len(parse_srt(demo).segments) == 10


async def test_a_timestamp_past_any_transcript_fails_the_job_at_once_naming_the_line(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, media_root: Path
) -> None:
    # 16 digits of hours are 3.6e22 ms: past the BIGINT columns (and a 64-bit JSON integer).
    far = "1\n00:00:01,000 --> 00:00:02,000\nHei\n\n2\n9999999999999999:00:00,000 --> "
    (media_root / "srt" / "far.srt").write_text(far + "9999999999999999:00:01,000\nHallo\n")
    row = await parse_job(pool, db_url, workspace, {"srt_path": "srt/far.srt"}, media_root)
    assert (row["status"], row["attempts"]) == ("error", 1)
    assert row["error_msg"] == (
        "malformed SRT at line 6: a number of 16 digits in the timestamp "
        "'9999999999999999:00:00,000' (at most 9)"
    )


async def test_storing_a_long_transcript_does_not_stall_the_event_loop(
    pool: asyncpg.Pool, workspace: UUID
) -> None:
    """Building a transcript's plain text, WebVTT and segment columns is most of a second for a
    long file (0.75 s for an 18.5 MB SRT); on the event loop it held every other job of the
    worker, its heartbeat and its timeouts (0.40 s here). It runs in a thread, and the segments
    go in statements of 20,000, as asyncpg encodes a statement's arrays on the loop (the bound
    leaves room for a loaded machine: a step measured 0.12 s once beside other test runs)."""
    segments = tuple(
        Segment(i * 1000, i * 1000 + 900, f"line {i} of a long transcript, spoken slowly")
        for i in range(200_000)
    )
    with longest_stall() as stall:
        await transcripts_store.replace_transcript(
            pool,
            workspace,
            "long",
            Transcript(segments),
            language="nb",
            source={},
            job_id=None,
        )
    assert stall[0] < 0.2, stall[0]
    assert await pool.fetchval(
        "SELECT segment_count FROM transcripts WHERE transcript_ref = 'long'"
    ) == len(segments)


# A parse in a process of its own, of a 20 MB SRT (the cap) made of `sys.argv[1]` repeated,
# printing its peak memory past what the text itself holds (VmHWM less VmRSS before it).
PARSE_PEAK = """
import re, sys
from pathlib import Path
from sidelinja_worker.jobs.transcripts.subtitles import SrtError, parse_srt
def memory(field):
    return int(re.search(field + r":\\s+(\\d+)", Path("/proc/self/status").read_text())[1])
unit = sys.argv[1]
text = unit * (20 * 1024 * 1024 // len(unit))
before = memory("VmRSS")
try:
    outcome = f"{len(parse_srt(text).segments)} segments"
except SrtError as exc:
    outcome = str(exc)
print((memory("VmHWM") - before) // 1024, outcome)
"""


@pytest.mark.parametrize(
    "unit, error",
    [
        # Short lines: every line became a string before the first was looked at (481 MB at
        # the peak, to fail at line 1).
        ("ab\n", "malformed SRT at line 1000001: more than 1,000,000 lines: not a transcript"),
        # 911,805 cues were parsed (8 s, 279 MB at the peak) and stored.
        (
            "0:0:0,0 --> 0:0:0,1\na\n\n",
            "malformed SRT at line 1000001: more than 1,000,000 lines: not a transcript",
        ),
        # Fewer lines than that, two to a cue: cues are counted as they come (75 MB at most).
        (
            "0:0:0,0 --> 0:0:0,1 " + "x" * 61 + "\na\n",
            "malformed SRT at line 400001: more than 200,000 cues: not a transcript",
        ),
    ],
)
def test_an_srt_of_millions_of_lines_or_cues_is_refused_in_bounded_memory(
    unit: str, error: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PARSE_PEAK, unit],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
    )
    peak_mb, outcome = done.stdout.strip().split(" ", 1)
    assert int(peak_mb) < 150, f"{peak_mb} MB above the text: {outcome}"
    assert error in outcome


async def test_a_long_transcript_is_embedded_in_bounded_passages_and_children(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, media_root: Path
) -> None:
    """A cue of 3.9 MB became one passage of 3.9 MB, far more than an embedding model reads,
    and every passage went into one generate_embeddings child: 7.9 MB of payload here, over
    the job payload cap (4 MB), so the child failed at once and the transcript got no
    embeddings at all."""
    words = " ".join(f"ord{i}" for i in range(400_000))  # ~3.3 MB in one cue
    lines = "\n".join(words[i : i + 15_000] for i in range(0, len(words), 15_000))
    cues = [f"1\n00:00:00,000 --> 00:00:01,000\n{lines}\n"]
    cues += [
        f"{i}\n00:00:{i // 1000 % 60:02d},{i % 1000:03d} --> 00:00:{i // 1000 % 60:02d},"
        f"{i % 1000:03d}\nDette er setning nummer {i} i en lang episode.\n"
        for i in range(2, 80_000)
    ]
    (media_root / "srt" / "long.srt").write_text("\n".join(cues))
    row = await parse_job(
        pool, db_url, workspace, {"srt_path": "srt/long.srt", "embed": True}, media_root
    )
    assert row["status"] == "completed", row["error_msg"]
    children = await pool.fetch(
        "SELECT payload, octet_length(payload::text) AS size, error_msg FROM job_queue"
        " WHERE job_type = 'generate_embeddings'"
    )
    assert len(children) > 1
    for child in children:
        assert child["size"] < executor.MAX_PAYLOAD_BYTES // 4, child["size"]
        assert "over the cap" not in (child["error_msg"] or "")
    items = sorted(
        (item for c in children for item in c["payload"]["items"]),
        key=lambda item: int(item["ref"].rpartition("#")[2]),
    )
    assert [item["ref"] for item in items] == [f"ep-1#{i}" for i in range(1, len(items) + 1)]
    assert max(len(item["text"]) for item in items) <= 2 * srt_parse.PASSAGE_CHARS
    # Nothing is lost or doubled at the cuts: the passages hold every word in order.
    spoken = " ".join(lines.split())  # the cue's words, some cut by its line breaks
    assert " ".join(item["text"] for item in items).startswith(spoken + " Dette er setning")
    assert items[-1]["text"].endswith("nummer 79999 i en lang episode.")


def test_a_word_longer_than_a_passage_is_cut_at_the_bound() -> None:
    word = "x" * (3 * srt_parse.PASSAGE_CHARS + 7)
    transcript = Transcript((Segment(0, 1000, f"kort {word} slutt"),))
    got = srt_parse.passages(transcript)
    assert "".join(got).replace(" ", "") == f"kort{word}slutt"
    assert all(len(p) <= 2 * srt_parse.PASSAGE_CHARS for p in got)
