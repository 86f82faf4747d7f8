"""stats_parse end to end on a real PostgreSQL: downloads written per day, episode and app; a
re-run adds nothing; ranges and partial lines across runs; rotation recognised; the periodic
next run scheduled once even when two runs race."""

from __future__ import annotations

import gzip
import os
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from uuid import UUID

import asyncpg
import orjson
import pytest
import zstandard

from sidelinja_worker.jobs.stats import store as stats_store
from sidelinja_worker.queue import client, store
from sidelinja_worker.queue.config import ServiceConfig
from tests.fakes.stalls import longest_stall
from tests.helpers import run_burst, statuses
from tests.test_stats_counting import EP, SIZE, SPOTIFY, line

# Yesterday (UTC): listener rows of days long past are pruned at once, so the logs are recent.
DAY = datetime.now(UTC).date() - timedelta(days=1)
DAY0 = datetime(DAY.year, DAY.month, DAY.day, tzinfo=UTC).timestamp()


def ln(ts: float = 3600, **fields: object) -> bytes:
    """A log line `ts` seconds after the start of DAY."""
    return line(ts=DAY0 + ts, **fields)  # type: ignore[arg-type]


@pytest.fixture
def media(tmp_path: Path, workspace: UUID) -> Path:
    """The workspace's media folder, MEDIA_ROOT/<workspace id>."""
    folder = tmp_path / "media" / str(workspace)
    folder.mkdir(parents=True)
    return folder


async def _run(
    pool: asyncpg.Pool,
    db_url: str,
    workspace: UUID,
    root: Path,
    logs: str = "logs",
    schedule: bool = False,
    jobs: int = 1,
) -> list[asyncpg.Record]:
    ids = [
        await client.enqueue(pool, workspace, "stats_parse", {"logs": logs, "schedule": schedule})
        for _ in range(jobs)
    ]
    await run_burst(
        pool,
        db_url,
        config=ServiceConfig({"MEDIA_ROOT": str(root.parent)}),
        max_concurrent=max(jobs, 1),
    )
    return [await store.get_job(pool, i) for i in ids]


async def _daily(pool: asyncpg.Pool, workspace: UUID) -> list[tuple[date, str, str, int]]:
    return [
        (r.day, r.episode, r.app, r.downloads)
        for r in await stats_store.daily_downloads(pool, workspace)
    ]


def _write(path: Path, *lines: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(lines))
    return path


def _rotated(folder: Path, data: bytes, kind: str) -> None:
    if kind == "gz":
        (folder / "access-2026-03-01T06-00-00.000.log.gz").write_bytes(gzip.compress(data))
    else:
        (folder / "access-2026-03-01T06-00-00.000-size.log.zst").write_bytes(
            zstandard.ZstdCompressor().compress(data)
        )


async def test_counts_by_the_rules_and_a_rerun_adds_nothing(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, media: Path
) -> None:
    _write(
        media / "logs" / "access.log",
        # A: three ranges that together are the whole file (no media file: 100% rule)
        ln(start=0, size=4_000_000),
        ln(start=4_000_000, size=4_000_000),
        ln(start=8_000_000, size=2_000_000),
        ln(start=0, size=4_000_000, ts=5000),  # A again: same day, same download
        ln(ip="198.51.100.20", ua=SPOTIFY, size=3_000_000),  # B: too little
        ln(ip="198.51.100.21", ua=SPOTIFY, status=200, range_=None, size=SIZE),  # C: whole
        ln(ip="198.51.100.7", ts=86400 + 10, status=200, range_=None, size=SIZE),  # A next day
        ln(ip="198.51.100.30", method="HEAD", status=200, range_=None, size=0),
        ln(ip="198.51.100.31", status=304, size=0, range_="bytes=0-"),
        ln(ip="198.51.100.32", range_="bytes=0-1", size=2),
        ln(ip="198.51.100.33", ua="Googlebot/2.1", status=200, range_=None, size=SIZE),
    )
    [job] = await _run(pool, db_url, workspace, media)
    assert job["status"] == "completed", job["error_msg"]
    assert job["result"]["new_downloads"] == 3
    expected = [
        (DAY, EP, "Apple Podcasts", 1),
        (DAY, EP, "Spotify", 1),
        (DAY + timedelta(days=1), EP, "Apple Podcasts", 1),
    ]
    assert await _daily(pool, workspace) == expected
    [again] = await _run(pool, db_url, workspace, media)
    assert again["result"]["lines"] == 0 and again["result"]["new_downloads"] == 0
    assert await _daily(pool, workspace) == expected
    # Addresses are never stored: only keyed hashes.
    dump = await pool.fetchval("SELECT string_agg(t::text, ' ') FROM podcast_listener_days t")
    assert "198.51.100" not in dump and "AppleCoreMedia" not in dump


async def test_a_request_path_with_a_nul_character_is_no_episode(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, media: Path
) -> None:
    # JSON escapes NUL as \u0000 and the log decoder reads it back. Such a path (no file has
    # one, and PostgreSQL stores no NUL in text) failed every run of the log while the line
    # was in it, and a failed run schedules no next one.
    nul = ln(ip="198.51.100.8", status=200, range_=None, size=SIZE).replace(
        EP.encode(), EP.encode()[:-4] + b"\\u0000.mp3"
    )
    assert b"\\u0000" in nul
    _write(media / "logs" / "access.log", nul, ln(status=200, range_=None, size=SIZE))
    [job] = await _run(pool, db_url, workspace, media)
    assert job["status"] == "completed", job["error_msg"]
    assert (job["result"]["requests_counted"], job["result"]["new_downloads"]) == (1, 1)
    assert await _daily(pool, workspace) == [(DAY, EP, "Apple Podcasts", 1)]


async def test_threshold_from_the_media_file_bitrate(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, media: Path
) -> None:
    frame = b"\xff\xfb\x90\x64" + b"\x00" * 413  # MPEG-1 layer III, 128 kbit/s: 960,000 B/min
    _write(media / "media" / "ep1.mp3", frame * 20_000)
    await pool.execute(
        "UPDATE workspaces SET settings = $2 WHERE id = $1",
        workspace,
        {"stats": {"url_prefix": "/podcast/", "media_dir": "media", "episodes": {EP: "ep-1"}}},
    )
    _write(
        media / "logs" / "access.log",
        ln(ip="198.51.100.1", size=960_000),  # one minute: a download
        ln(ip="198.51.100.2", size=959_999),
    )  # a byte short
    [job] = await _run(pool, db_url, workspace, media)
    assert job["status"] == "completed", job["error_msg"]
    assert await _daily(pool, workspace) == [(DAY, "ep-1", "Apple Podcasts", 1)]


async def test_an_episode_file_hard_linked_from_another_workspace_is_not_read(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, media: Path
) -> None:
    # The bitrate of another workspace's episode would set this workspace's threshold: the
    # hard link is refused, and the threshold is the whole file, as the log gives its size.
    frame = b"\xff\xfb\x90\x64" + b"\x00" * 413  # MPEG-1 layer III, 128 kbit/s: 960,000 B/min
    other = _write(media.parent / "another-workspace" / "ep1.mp3", frame * 20_000)
    (media / "media").mkdir()
    os.link(other, media / "media" / "ep1.mp3")
    await pool.execute(
        "UPDATE workspaces SET settings = $2 WHERE id = $1",
        workspace,
        {"stats": {"url_prefix": "/podcast/", "media_dir": "media", "episodes": {EP: "ep-1"}}},
    )
    _write(media / "logs" / "access.log", ln(ip="198.51.100.1", size=960_000))
    [job] = await _run(pool, db_url, workspace, media)
    assert job["status"] == "completed", job["error_msg"]
    assert job["result"]["requests_counted"] == 1
    assert await _daily(pool, workspace) == []  # a minute of 10 MB is no download


async def test_ranges_and_a_partial_line_across_runs(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, media: Path
) -> None:
    live = media / "logs" / "access.log"
    first, second, third = (
        ln(start=0, size=6_000_000),
        ln(start=6_000_000, size=4_000_000, ts=4000),
        ln(start=0, size=1_000_000, ts=9000),
    )  # a replay: same download
    # 6 MB now, 4 + 1 MB in the next run: only the sum across runs reaches the 10 MB file size.
    _write(live, first, second[:200])  # the second line is still being written
    [one] = await _run(pool, db_url, workspace, media)
    assert one["result"]["lines"] == 1 and await _daily(pool, workspace) == []
    _write(live, first, second, third)
    [two] = await _run(pool, db_url, workspace, media)
    assert two["result"]["lines"] == 2 and two["result"]["new_downloads"] == 1
    assert await _daily(pool, workspace) == [(DAY, EP, "Apple Podcasts", 1)]


async def _rotation(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, root: Path, kind: str
) -> None:
    folder = root / "logs"
    old = [ln(ip=f"198.51.100.{i}", status=200, range_=None, size=SIZE) for i in range(1, 4)]
    _write(folder / "access.log", *old[:2])
    [one] = await _run(pool, db_url, workspace, root, logs="logs/access.log")
    assert one["result"]["new_downloads"] == 2
    # Caddy wrote one more line, then rolled the file (renamed, compressed) and started anew.
    (folder / "access.log").unlink()
    _rotated(folder, b"".join(old), kind)
    _write(folder / "access.log", ln(ip="198.51.100.9", status=200, range_=None, size=SIZE))
    [two] = await _run(pool, db_url, workspace, root, logs="logs/access.log")
    assert two["result"]["lines"] == 2 and two["result"]["new_downloads"] == 2
    [three] = await _run(pool, db_url, workspace, root, logs="logs/access.log")
    assert (
        three["result"]["lines"] == 0 and three["result"]["files_read"] == 1
    )  # only the live file
    assert await _daily(pool, workspace) == [(DAY, EP, "Apple Podcasts", 4)]


async def test_rotated_gz_file_is_known_as_already_read(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, media: Path
) -> None:
    await _rotation(pool, db_url, workspace, media, "gz")


async def test_rotated_zst_file_is_known_as_already_read(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, media: Path
) -> None:
    await _rotation(pool, db_url, workspace, media, "zst")


async def test_racing_runs_count_once_and_schedule_one_next_run(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, media: Path
) -> None:
    await pool.execute(
        "UPDATE workspaces SET settings = $2 WHERE id = $1",
        workspace,
        {"stats": {"interval": "1h"}},
    )
    _write(
        media / "logs" / "access.log",
        *(ln(ip=f"198.51.100.{i}", status=200, range_=None, size=SIZE) for i in range(1, 6)),
    )
    before = datetime.now(UTC)
    jobs = await _run(pool, db_url, workspace, media, schedule=True, jobs=2)
    assert [j["status"] for j in jobs] == ["completed", "completed"], [j["error_msg"] for j in jobs]
    assert sorted(j["result"]["new_downloads"] for j in jobs) == [0, 5]
    assert await _daily(pool, workspace) == [(DAY, EP, "Apple Podcasts", 5)]
    pending = await pool.fetch(
        "SELECT scheduled_for, unique_key, payload FROM job_queue"
        " WHERE status = 'pending' AND job_type = 'stats_parse'"
    )
    assert len(pending) == 1, pending
    next_run = pending[0]["scheduled_for"]
    assert (
        next_run.minute == 0
        and next_run.second == 0
        and 0 < (next_run - before).total_seconds() <= 3600
    )
    assert jobs[0]["result"]["next_run"] == jobs[1]["result"]["next_run"] == next_run.isoformat()
    assert pending[0]["payload"] == {"logs": "logs", "schedule": True}
    assert (await statuses(pool)) == {"completed": 2, "pending": 1}


async def test_bad_paths_fail_permanently(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, media: Path
) -> None:
    root = media
    _write(media.parent / "outside" / "access.log", ln())  # another workspace's folder
    _write(root / "empty" / "readme.txt", b"x")
    _write(root / "logs" / "access.log", ln())
    paths = ("../outside", "nope", "empty", "*/../../../../**/*.log", "logs/a**.log")
    ids = [await client.enqueue(pool, workspace, "stats_parse", {"logs": p}) for p in paths]
    await run_burst(pool, db_url, config=ServiceConfig({"MEDIA_ROOT": str(root.parent)}))
    errors = [(j["status"], j["error_msg"]) for j in [await store.get_job(pool, i) for i in ids]]
    assert errors == [
        ("error", "logs '../outside' is outside this workspace's media folder"),
        ("error", "logs 'nope' not found in this workspace's media folder"),
        ("error", "logs 'empty': no log files found"),
        # A glob never walks out of the folder (from '/' it walked the whole file system).
        ("error", "logs '*/../../../../**/*.log': a glob may not go up with '..'"),
        ("error", "logs 'logs/a**.log': a glob takes '**' at most once, as a whole path segment"),
    ]


async def test_finding_the_logs_does_not_stall_the_event_loop(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, media: Path
) -> None:
    # Finding the logs is blocking file-system calls, per folder and per file for each folder
    # it is in (a '**' glob over a big or deep folder: thousands), which other jobs on the
    # worker's event loop must not wait for.
    folder = media / "logs" / Path(*["d"] * 200)
    folder.mkdir(parents=True)
    for f in range(150):
        (folder / f"old-{f}.log").touch()
    with longest_stall() as stall:
        [job] = await _run(pool, db_url, workspace, media, logs="logs/**/*.log")
    assert (job["status"], job["result"]["files"]) == ("completed", 0)
    assert stall[0] < 0.1


async def test_country_from_a_geoip_database(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, media: Path
) -> None:
    pytest.importorskip("maxminddb")
    writer_mod = pytest.importorskip("mmdb_writer")
    netaddr = pytest.importorskip("netaddr")
    writer = writer_mod.MMDBWriter(
        ip_version=6, ipv4_compatible=True, database_type="GeoLite2-Country"
    )
    writer.insert_network(netaddr.IPSet(["198.51.100.0/24"]), {"country": {"iso_code": "NO"}})
    writer.insert_network(netaddr.IPSet(["2001:db8:1::/48"]), {"country": {"iso_code": "SE"}})
    writer.to_db_file(str(media / "geo.mmdb"))
    whole = {"status": 200, "range_": None, "size": SIZE}
    _write(
        media / "logs" / "access.log",
        ln(ip="198.51.100.1", **whole),
        ln(ip="2001:db8:1:2::1", **whole),
        ln(ip="203.0.113.1", **whole),
    )
    await client.enqueue(pool, workspace, "stats_parse", {"logs": "logs", "schedule": False})
    await run_burst(
        pool,
        db_url,
        config=ServiceConfig(
            {"MEDIA_ROOT": str(media.parent), "GEOIP_DB": str(media / "geo.mmdb")}
        ),
    )
    rows = await stats_store.daily_downloads(pool, workspace)
    assert sorted((r.country, r.downloads) for r in rows) == [("", 1), ("NO", 1), ("SE", 1)]


async def test_a_client_ip_that_is_no_address_is_a_bad_line_under_geoip(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, media: Path
) -> None:
    # A proxy that writes 'unknown' or an address with its port: the country lookup raised
    # ValueError while the rows were hashed, and every run of the log failed.
    pytest.importorskip("maxminddb")
    writer_mod = pytest.importorskip("mmdb_writer")
    netaddr = pytest.importorskip("netaddr")
    writer = writer_mod.MMDBWriter(
        ip_version=6, ipv4_compatible=True, database_type="GeoLite2-Country"
    )
    writer.insert_network(netaddr.IPSet(["198.51.100.0/24"]), {"country": {"iso_code": "NO"}})
    writer.to_db_file(str(media / "geo.mmdb"))
    whole = {"status": 200, "range_": None, "size": SIZE}
    bad = ["unknown", "198.51.100.2:443", "gggg:db8:1:2::1", "198.51.100.2\x00"]
    _write(
        media / "logs" / "access.log",
        ln(ip="198.51.100.1", **whole),
        *(ln(ip=ip, **whole) for ip in bad),
    )
    job = await client.enqueue(pool, workspace, "stats_parse", {"logs": "logs", "schedule": True})
    await run_burst(
        pool,
        db_url,
        config=ServiceConfig(
            {"MEDIA_ROOT": str(media.parent), "GEOIP_DB": str(media / "geo.mmdb")}
        ),
    )
    done = await store.get_job(pool, job)
    assert done["status"] == "completed", done["error_msg"]
    assert (done["result"]["bad_lines"], done["result"]["new_downloads"]) == (len(bad), 1)
    assert "next_run" in done["result"]
    rows = await stats_store.daily_downloads(pool, workspace)
    assert [(r.country, r.downloads) for r in rows] == [("NO", 1)]


async def test_a_log_whose_name_is_not_utf8_is_counted_and_the_next_run_scheduled(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, media: Path
) -> None:
    # A file name is bytes; PostgreSQL's text and JSON take only UTF-8.
    logs = media / "logs"
    logs.mkdir()
    (logs / os.fsdecode(b"caddy-\xff.log")).write_bytes(ln(status=200, range_=None, size=SIZE))
    [job] = await _run(pool, db_url, workspace, media, schedule=True)
    assert job["status"] == "completed", job["error_msg"]
    assert job["result"]["new_downloads"] == 1 and "next_run" in job["result"]
    names = await pool.fetch("SELECT last_name FROM podcast_log_files")
    assert [r["last_name"] for r in names] == ["caddy-\ufffd.log"]


async def test_a_log_hard_linked_from_another_workspace_is_refused_and_reported(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, media: Path
) -> None:
    # A hard link is a name in this folder for the other workspace's file: its downloads are
    # not this workspace's.
    other = _write(media.parent / "another-workspace" / "access.log", ln(status=200, range_=None))
    (media / "logs").mkdir()
    os.link(other, media / "logs" / "access.log")
    [job] = await _run(pool, db_url, workspace, media)
    assert job["status"] == "completed", job["error_msg"]
    assert job["result"]["file_errors"] == [
        "access.log: has 2 links: a hard link may be another workspace's file, refused"
    ]
    assert (job["result"]["requests_counted"], await _daily(pool, workspace)) == (0, [])


async def test_lines_with_times_no_download_can_have_are_bad_lines_and_the_run_goes_on(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, media: Path
) -> None:
    # `ts` as Caddy's other time formats write it (wall clock, milliseconds), out of any date's
    # range or before 1970: each failed every run, for good (a string in the parse, a number at
    # its dates); a day ahead was counted, its rows past every pruning.
    whole = {"status": 200, "range_": None, "size": SIZE}
    odd = [
        "2026/03/01 10:00:00.000",
        "not a time",
        1e300,
        -1e12,
        DAY0 * 1000,
        DAY0 + 3 * 86400,
    ]
    lines = []
    for ts in odd:
        entry = orjson.loads(ln(ip="203.0.113.9", **whole))
        entry["ts"] = ts
        lines.append(orjson.dumps(entry) + b"\n")
    _write(media / "logs" / "access.log", *lines, ln(**whole))
    [job] = await _run(pool, db_url, workspace, media, schedule=True)
    assert job["status"] == "completed", job["error_msg"]
    result = job["result"]
    assert (result["lines"], result["bad_lines"], result["new_downloads"]) == (7, 6, 1)
    assert "next_run" in result
    assert await _daily(pool, workspace) == [(DAY, EP, "Apple Podcasts", 1)]


def _with(entry: bytes, *, request: dict[str, list[str]] | None = None, **fields: object) -> bytes:
    """`entry` with its top-level `fields` and request headers replaced."""
    decoded = orjson.loads(entry)
    decoded.update(fields)
    decoded["request"]["headers"].update(request or {})
    return orjson.dumps(decoded) + b"\n"


async def test_numbers_past_any_file_in_a_line_do_not_end_every_run(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, media: Path
) -> None:
    # Digits Python's int() refuses (a superscript, 5,000 of them), and sizes past PostgreSQL's
    # BIGINT: each failed the run, every run, for good (a ValueError in the parse, or a
    # DataError at the commit).
    partial, whole = ln(ip="203.0.113.9"), ln(ip="203.0.113.9", status=200, range_=None)
    odd_range = [f"bytes 0-999999/{total}" for total in ("1²", "9" * 5000, "9" * 30)]
    _write(
        media / "logs" / "access.log",
        *(_with(partial, resp_headers={"Content-Range": [r]}) for r in odd_range),
        *(_with(whole, resp_headers={"Content-Length": [n]}) for n in ("1²", "9" * 30)),
        *(_with(partial, request={"Range": [r]}) for r in ("bytes=0-1²", "bytes=0-" + "9" * 5000)),
        *(partial.replace(b'"size":1000000', b'"size":' + n) for n in (b"1" + b"0" * 30, b"-5")),
        ln(status=200, range_=None, size=SIZE),
    )
    [job] = await _run(pool, db_url, workspace, media, schedule=True)
    assert job["status"] == "completed", job["error_msg"]
    assert "next_run" in job["result"]
    assert await _daily(pool, workspace) == [(DAY, EP, "Apple Podcasts", 1)]


async def test_an_episode_path_through_a_symlink_loop_does_not_end_every_run(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, media: Path
) -> None:
    # Resolving a path through a loop raises RuntimeError (Python 3.11), not OSError: the
    # episode's media file, looked up for every episode the log names, failed every run.
    (media / "media").mkdir()
    (media / "media" / "ep1.mp3").symlink_to(media / "media" / "ep1.mp3")
    await pool.execute(
        "UPDATE workspaces SET settings = $2 WHERE id = $1",
        workspace,
        {"stats": {"url_prefix": "/podcast/", "media_dir": "media"}},
    )
    _write(media / "logs" / "access.log", ln(status=200, range_=None, size=SIZE))
    [job] = await _run(pool, db_url, workspace, media, schedule=True)
    assert job["status"] == "completed", job["error_msg"]
    assert await _daily(pool, workspace) == [(DAY, EP, "Apple Podcasts", 1)]


async def test_logs_through_a_symlink_loop_fail_at_once_naming_it(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, media: Path
) -> None:
    (media / "loop").symlink_to(media / "loop")
    [job] = await _run(pool, db_url, workspace, media, logs="loop/*.log")
    assert (job["status"], job["attempts"]) == ("error", 1), job["error_msg"]
    assert job["error_msg"].startswith("logs 'loop/*.log' cannot be resolved: Symlink loop")


async def test_a_listener_day_at_bigints_top_stops_there_and_the_runs_go_on(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, media: Path
) -> None:
    # A listener's bytes of a day are any writer's row, and every run adds to them: one near
    # BIGINT's top made the next run's sum fail (bigint out of range), and every run after it,
    # so the workspace's downloads were never counted again.
    log = media / "logs" / "access.log"
    _write(log, ln(ip="203.0.113.9"))
    [first] = await _run(pool, db_url, workspace, media)
    assert first["status"] == "completed", first["error_msg"]
    await pool.execute(
        "UPDATE podcast_listener_days SET bytes = 9223372036854775000 WHERE workspace_id = $1",
        workspace,
    )
    with log.open("ab") as f:
        f.write(ln(3700, ip="203.0.113.9"))
    [second] = await _run(pool, db_url, workspace, media)
    assert second["status"] == "completed", second["error_msg"]
    assert (
        await pool.fetchval(
            "SELECT bytes FROM podcast_listener_days WHERE workspace_id = $1", workspace
        )
        == (1 << 63) - 1
    )
    assert await _daily(pool, workspace) == [(DAY, EP, "Apple Podcasts", 1)]
