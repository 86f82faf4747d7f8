"""stats_parse without the database: the IAB counting rules, reading live and rotated Caddy
logs (gz, zst, both naming schemes), and a partial last line."""

from __future__ import annotations

import gzip
import os
import pickle
from itertools import accumulate
from pathlib import Path

import orjson
import pytest
import zstandard

from sidelinja_worker.jobs.stats import logfiles
from sidelinja_worker.jobs.stats.agents import AgentClassifier
from sidelinja_worker.jobs.stats.counting import EpisodeRules, Tally, ip_key, is_probe
from sidelinja_worker.jobs.stats.logfiles import (
    LogFile,
    discover,
    fingerprint,
    read_batches,
    read_blocks,
)
from sidelinja_worker.jobs.stats.media import threshold_bytes
from sidelinja_worker.jobs.stats.parse import FileTask, ParseResult, parse_files
from sidelinja_worker.jobs.stats.stats_parse import resolve_logs
from sidelinja_worker.queue.errors import PermanentError

APPLE = "AppleCoreMedia/1.0.0.21E236 (iPhone; U; CPU OS 17_4 like Mac OS X; nb_no)"
SPOTIFY = "Spotify/8.9.30 iOS/17.4 (iPhone15,2)"
EP = "/podcast/ep1.mp3"
DAY0 = 1_772_323_200.0  # 2026-03-01T00:00:00Z
SIZE = 10_000_000


def line(
    ts: float = DAY0 + 3600,
    ip: str = "198.51.100.7",
    ua: str | None = APPLE,
    uri: str = EP,
    method: str = "GET",
    status: int = 206,
    start: int = 0,
    size: int = 1_000_000,
    range_: str | None = "auto",
    total: int = SIZE,
) -> bytes:
    """One Caddy access-log line as Caddy writes it (fields it logs but we ignore included)."""
    headers: dict[str, list[str]] = {"Accept": ["*/*"], "Cookie": ["REDACTED"]}
    if ua is not None:
        headers["User-Agent"] = [ua]
    if range_ == "auto" and status == 206:
        range_ = f"bytes={start}-{start + size - 1}"
    if range_ not in (None, "auto"):
        headers["Range"] = [range_]
    resp = {"Server": ["Caddy"], "Content-Length": [str(size if status == 206 else total)]}
    if status == 206:
        resp["Content-Range"] = [f"bytes {start}-{start + size - 1}/{total}"]
    return (
        orjson.dumps(
            {
                "level": "info",
                "ts": ts,
                "logger": "http.log.access.log0",
                "msg": "handled request",
                "request": {
                    "remote_ip": ip,
                    "remote_port": "50123",
                    "client_ip": ip,
                    "proto": "HTTP/2.0",
                    "method": method,
                    "host": "pod.example.no",
                    "uri": uri,
                    "headers": headers,
                },
                "bytes_read": 0,
                "user_id": "",
                "duration": 0.5,
                "size": size,
                "status": status,
                "resp_headers": resp,
            }
        )
        + b"\n"
    )


def tally(*lines: bytes) -> Tally:
    t = Tally(EpisodeRules())
    t.add_lines(b"".join(lines).split(b"\n"))
    return t


def bytes_by_listener(t: Tally) -> dict[tuple[int, str, str, str], int]:
    return {k: v.bytes for k, v in t.listens.items()}


def test_ranges_of_one_listener_are_summed() -> None:
    t = tally(
        line(start=0, size=400_000),
        line(start=400_000, size=700_000),
        line(start=1_100_000, size=50_000, ts=DAY0 + 7200),
    )
    assert list(bytes_by_listener(t).values()) == [1_150_000]
    assert t.sizes == {EP: SIZE}


def test_head_304_probes_and_other_paths_are_not_counted() -> None:
    t = tally(
        line(method="HEAD", status=200, range_=None),
        line(status=304, size=0, range_="bytes=0-"),
        line(range_="bytes=0-1", size=2),
        line(range_="bytes=5000-5001", size=2),
        line(uri="/feed.xml", status=200, range_=None),
        line(status=404, size=0, range_=None),
        line(method="POST", status=200, range_=None),
    )
    assert t.listens == {}
    assert is_probe("bytes=0-1") and not is_probe("bytes=0-") and not is_probe("bytes=0-2")


def test_bots_watch_duplicates_and_missing_agents_are_dropped() -> None:
    dropped = [
        "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)",
        "atc/1.0 watchOS/10.4 model/Watch6,1 hwp/t8301 build/21T216 (6; dt:249)",
        "AppleCoreMedia/1.0 (null)/(null) watchOS/10.4",
        "curl/8.5.0",
        "SomeNewCrawler/1.0",
        "my-spider",
        "",
    ]
    t = tally(*(line(ua=ua) for ua in dropped), line(ua=None))
    assert t.listens == {}
    agents = AgentClassifier()
    assert agents.family(APPLE) == "Apple Podcasts"
    assert agents.family(SPOTIFY) == "Spotify"
    assert agents.family("SomePlayer/2.0") == "Other"


def test_ip_and_agent_make_the_listener_ipv6_cut_to_64() -> None:
    t = tally(
        line(ip="2001:db8:1:2::1"),
        line(ip="2001:db8:1:2:ffff::9"),
        line(ip="2001:db8:1:3::1"),
        line(ip="198.51.100.7", ua=SPOTIFY),
        line(ip="198.51.100.8"),
    )
    ips = sorted((k[2], k[3] == SPOTIFY, v) for k, v in bytes_by_listener(t).items())
    assert ips == [
        ("198.51.100.7", True, 1_000_000),
        ("198.51.100.8", False, 1_000_000),
        ("2001:0db8:0001:0002::/64", False, 2_000_000),
        ("2001:0db8:0001:0003::/64", False, 1_000_000),
    ]
    assert ip_key("::ffff:198.51.100.7") == "198.51.100.7"


def test_utc_calendar_day_splits_a_listener() -> None:
    t = tally(line(ts=DAY0 - 1), line(ts=DAY0), line(ts=DAY0 + 86399), line(ts=DAY0 + 86400))
    days = sorted((k[0], v) for k, v in bytes_by_listener(t).items())
    first = int(DAY0 // 86400)
    assert days == [(first - 1, 1_000_000), (first, 2_000_000), (first + 1, 1_000_000)]


def test_whole_200_and_iso_timestamps() -> None:
    whole = line(status=200, range_=None, size=SIZE)
    aborted = line(status=200, range_=None, size=5000, ip="198.51.100.9")
    iso = orjson.loads(line(ip="198.51.100.10"))
    iso["ts"] = "2026-03-01T01:00:00.000Z"
    t = tally(whole, aborted, orjson.dumps(iso) + b"\n", b"not json\n")
    whole_by_ip = {k[2]: v.whole for k, v in t.listens.items()}
    assert whole_by_ip == {"198.51.100.7": True, "198.51.100.9": False, "198.51.100.10": False}
    assert {k[0] for k in t.listens} == {int(DAY0 // 86400)}
    assert t.bad_lines == 1


def test_episode_mapping_and_hosts() -> None:
    rules = EpisodeRules(episodes={EP: "ep-1"}, hosts=("pod.example.no",))
    t = Tally(rules)
    t.add_lines([line(uri=EP + "?from=rss"), line(uri="/podcast/other.mp3")])
    assert [k[1] for k in t.listens] == ["ep-1"]
    t2 = Tally(EpisodeRules(hosts=("elsewhere.no",)))
    t2.add_lines([line()])
    assert t2.listens == {}


def test_hosts_match_without_port_brackets_or_case() -> None:
    def at(host: str) -> bytes:
        return line().replace(b'"pod.example.no"', orjson.dumps(host))

    for host, allowed, counts in [
        ("Pod.Example.no:443", "pod.example.no", True),
        ("[2001:db8::1]:8443", "2001:db8::1", True),
        ("[2001:db8::1]", "[2001:db8::1]", True),
        ("[2001:db8::1]:8443", "2001:db8::2", False),
        ("pod.example.no.evil:443", "pod.example.no", False),
    ]:
        t = Tally(EpisodeRules(hosts=(allowed,)))
        t.add_lines([at(host)])
        assert bool(t.listens) is counts, (host, allowed)


def test_partial_last_line_is_left_for_the_next_run(tmp_path: Path) -> None:
    live = tmp_path / "access.log"
    first, second = line(ip="198.51.100.1"), line(ip="198.51.100.2")
    live.write_bytes(first + second[:100])  # Caddy is still writing the second line
    log = LogFile(live, rotated=False)
    batches = list(read_batches(log, 0))
    offset = batches[-1][1]
    assert offset == len(first)
    assert [b for lines, _ in batches for b in lines] == [first.rstrip(b"\n")]
    live.write_bytes(first + second)
    rest = list(read_batches(log, offset))
    assert [b for lines, _ in rest for b in lines] == [second.rstrip(b"\n")]
    assert rest[-1][1] == len(first) + len(second)


def test_rotated_names_compression_and_fingerprints(tmp_path: Path) -> None:
    text = line(ip="198.51.100.1") + line(ip="198.51.100.2")
    (tmp_path / "access.log").write_bytes(line(ip="198.51.100.3"))
    lumberjack = tmp_path / "access-2024-05-01T12-30-00.000.log.gz"
    lumberjack.write_bytes(gzip.compress(text))
    timberjack = tmp_path / "access-2026-03-01T00-00-00.000-size.log.zst"
    timberjack.write_bytes(zstandard.ZstdCompressor().compress(text + line(ip="198.51.100.4")))
    (tmp_path / "other-2026-03-01T00-00-00.000-time.log").write_bytes(line())
    (tmp_path / "notes.txt").write_bytes(b"x")
    names = [f.path.name for f in discover(tmp_path / "access.log", None)]
    assert names == [lumberjack.name, timberjack.name, "access.log"]
    assert len(discover(tmp_path, None)) == 4
    # Same text, renamed and compressed: the same fingerprint (timberjack's adds a line after).
    plain = tmp_path / "x.log"
    plain.write_bytes(text)
    assert fingerprint(plain) == fingerprint(lumberjack) == fingerprint(timberjack)
    tasks = [FileTask(p, True, "fp", 0) for p in (lumberjack, timberjack)]
    result = parse_files(tasks, EpisodeRules())
    assert result.lines == 5 and len(result.listens) == 3  # .1 and .2 twice, .4
    assert [f.offset for f in result.files] == [len(text), len(text) + len(line(ip="198.51.100.4"))]
    # Resuming a compressed file mid-way reads only the rest.
    again = parse_files(
        [FileTask(lumberjack, True, "fp", len(line(ip="198.51.100.1")))], EpisodeRules()
    )
    assert again.lines == 1


def test_threshold_from_mp3_bitrate(tmp_path: Path) -> None:
    mp3 = tmp_path / "ep.mp3"
    id3 = b"ID3\x03\x00\x00\x00\x00\x08\x00" + b"\x00" * 1024  # 1024-byte tag (syncsafe 0x0800)
    frame = b"\xff\xfb\x90\x64" + b"\x00" * 413  # MPEG-1 layer III, 128 kbit/s, 44.1 kHz
    mp3.write_bytes(id3 + frame * 20_000)  # ~522 s of audio
    assert threshold_bytes(mp3, None) == 1034 + 128_000 * 60 // 8
    short = tmp_path / "short.mp3"
    short.write_bytes(id3 + frame * 100)  # ~2.6 s: the whole file
    assert threshold_bytes(short, None) == short.stat().st_size
    assert threshold_bytes(tmp_path / "missing.mp3", 5000) == 5000
    assert threshold_bytes(None, None) is None


def test_a_truncated_rotated_file_is_read_up_to_the_damage(tmp_path: Path) -> None:
    data = gzip.compress(b"".join(line(ip=f"198.51.{i // 250}.{i % 250}") for i in range(6000)))
    broken = tmp_path / "access-2024-05-01T12-30-00.000.log.gz"
    broken.write_bytes(data[: len(data) // 2])
    result = parse_files([FileTask(broken, True, "fp", 0)], EpisodeRules())
    assert result.errors and "EOFError" in result.errors[0]
    assert result.files[0].complete and result.files[0].offset > 0 and result.lines > 1000


def test_a_bad_line_in_a_block_loses_only_that_line(tmp_path: Path) -> None:
    good = [line(ip=f"198.51.100.{i}") for i in range(5)]
    log = tmp_path / "access.log"
    log.write_bytes(
        good[0] + good[1] + b'{"ts": 17\n' + b"\n" + good[2] + b"not json\n" + good[3] + good[4]
    )
    result = parse_files([FileTask(log, False, "fp", 0)], EpisodeRules())
    assert len(result.listens) == 5 and result.counted_requests == 5
    assert result.bad_lines == 2 and result.lines == 7  # the blank line is not a line


def test_blocks_end_at_line_ends_whatever_the_chunk_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(logfiles, "CHUNK_BYTES", 333)  # lines of ~600 bytes straddle chunks
    lines = [line(ip=f"198.51.100.{i}") for i in range(20)]
    text = b"".join(lines)
    live = tmp_path / "access.log"
    live.write_bytes(text + lines[0][:50])  # Caddy is still writing the last line
    log = LogFile(live, rotated=False)
    blocks = [(bytes(b), offset) for b, offset in read_blocks(log, 0)]  # a view lasts one turn
    assert b"".join(b for b, _ in blocks) == text
    ends = set(accumulate(len(x) for x in lines))
    assert {offset for _, offset in blocks} <= ends and blocks[-1][1] == len(text)
    middle = blocks[len(blocks) // 2][1]
    assert b"".join(bytes(b) for b, _ in read_blocks(log, middle)) == text[middle:]
    rotated = LogFile(live, rotated=True)  # a rotated file's unterminated last line is final
    assert list(read_blocks(rotated, len(text)))[-1][1] == len(text) + 50


def test_an_overlong_line_is_dropped_and_memory_stays_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(logfiles, "CHUNK_BYTES", 333)
    monkeypatch.setattr(logfiles, "MAX_LINE_BYTES", 4000)
    junk = b"x" * 50_000 + b"\n"  # no Caddy entry: it must not be held whole
    good = [line(ip="198.51.100.1"), line(ip="198.51.100.2")]
    log = tmp_path / "access.log"
    log.write_bytes(good[0] + junk + good[1])
    blocks = [(bytes(b), offset) for b, offset in read_blocks(LogFile(log, False), 0)]
    assert max(len(b) for b, _ in blocks) < 4000 + 2 * 333
    assert good[0] in blocks[0][0] and blocks[-1][0].endswith(good[1])
    assert blocks[-1][1] == log.stat().st_size
    result = parse_files([FileTask(log, False, "fp", 0)], EpisodeRules())
    assert result.counted_requests == 2 and result.bad_lines == 1


def test_days_of_lines_out_of_order_and_of_mixed_timestamp_formats() -> None:
    iso = orjson.loads(line())
    iso["ts"] = "2026-03-01T23:59:59.500Z"
    t = Tally(EpisodeRules())
    t.add_block(
        b"".join(
            [
                line(ts=DAY0 + 86400),
                line(ts=DAY0 - 0.5),
                orjson.dumps(iso) + b"\n",
                line(ts=DAY0 + 86399.9),
                line(ts=DAY0 + 86400.0),
                line(ts=DAY0),
            ]
        )
    )
    first = int(DAY0 // 86400)
    days = sorted((k[0], v) for k, v in bytes_by_listener(t).items())
    assert days == [(first - 1, 1_000_000), (first, 3_000_000), (first + 1, 2_000_000)]


def test_odd_response_headers_count_the_request_without_a_size() -> None:
    odd = orjson.loads(line())
    odd["resp_headers"] = "none"  # Caddy writes an object; the request still counts
    t = tally(orjson.dumps(odd) + b"\n")
    assert list(bytes_by_listener(t).values()) == [1_000_000] and t.sizes == {}


def test_a_parse_result_survives_the_trip_to_the_worker(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    log.write_bytes(
        line(status=200, range_=None, size=SIZE)
        + line(ip="198.51.100.8", ua=SPOTIFY)
        + line(ip="2001:db8:1:2::1", ts=DAY0 + 86400)
        + b"not json\n"
    )
    result = parse_files([FileTask(log, False, "fp", 0)], EpisodeRules())
    again = pickle.loads(pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL))
    assert again == result and len(again.listens) == 3 and again.bad_lines == 1
    assert [v.whole for v in again.listens.values()] == [True, False, False]
    assert pickle.loads(pickle.dumps(ParseResult())) == ParseResult()


def old_caddy(ip: str, client_ip: str | None = None) -> bytes:
    """A line as Caddy < 2.7 writes it (no `client_ip`), or with the given `client_ip`."""
    entry = orjson.loads(line(ip=ip))
    del entry["request"]["client_ip"]
    if client_ip is not None:
        entry["request"]["client_ip"] = client_ip
    return orjson.dumps(entry) + b"\n"


@pytest.mark.parametrize("hosts", [(), ("pod.example.no",)])
@pytest.mark.parametrize("by_block", [True, False])
def test_remote_ip_counts_when_client_ip_is_missing_or_empty(
    hosts: tuple[str, ...], by_block: bool
) -> None:
    # The parse decodes without remote_ip until it meets such a line, mid-block here, then
    # decodes the rest of the block again with it: every line still counts exactly once.
    lines = [
        line(ip="198.51.100.1"),
        line(uri="/feed.xml", status=200, range_=None),
        old_caddy("198.51.100.2"),
        line(ip="198.51.100.3"),
        old_caddy("198.51.100.4", ""),
        old_caddy("198.51.100.5", "198.51.100.6"),
        line(ip="198.51.100.1", start=5),
    ]
    t = Tally(EpisodeRules(hosts=hosts))
    if by_block:
        t.add_block(b"".join(lines))
    else:
        t.add_lines(b"".join(lines).split(b"\n"))
    assert {k[2]: v for k, v in bytes_by_listener(t).items()} == {
        "198.51.100.1": 2_000_000,
        "198.51.100.2": 1_000_000,
        "198.51.100.3": 1_000_000,
        "198.51.100.4": 1_000_000,
        "198.51.100.6": 1_000_000,
    }
    assert t.counted_requests == 6 and t.lines == 7 and t.bad_lines == 0
    t.add_block(old_caddy("198.51.100.7"))  # from now on every line keeps remote_ip
    assert t.counted_requests == 7


def blocks_and_error(log: LogFile) -> tuple[list[tuple[bytes, int]], str]:
    got: list[tuple[bytes, int]] = []
    try:
        got.extend((bytes(block), offset) for block, offset in read_blocks(log, 0))
    except Exception as exc:  # what parse_files would report, or let through
        return got, type(exc).__name__
    return got, ""


@pytest.mark.parametrize("damage", ["none", "truncated", "corrupt"])
def test_gzip_reads_with_isal_and_like_the_stdlib_up_to_damage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str
) -> None:
    data = bytearray(
        gzip.compress(b"".join(line(ip=f"198.51.{i // 250}.{i % 250}") for i in range(6000)))
    )
    if damage == "truncated":
        data = data[: len(data) // 2]
    elif damage == "corrupt":
        data[len(data) // 2 : len(data) // 2 + 64] = bytes(64)
    path = tmp_path / "access-2024-05-01T12-30-00.000.log.gz"
    path.write_bytes(data)
    log = LogFile(path, rotated=True)
    with logfiles.open_stream(path) as stream:
        assert isinstance(stream.raw, logfiles.GzipReader)  # type: ignore[attr-defined]
    fast = blocks_and_error(log)
    monkeypatch.setattr(logfiles, "decompress", lambda raw, suffix: gzip.GzipFile(fileobj=raw))
    assert fast == blocks_and_error(log)
    assert (fast[1] == "") == (damage == "none") and len(fast[0]) > 5


def test_a_named_pipe_is_never_a_log_file(tmp_path: Path) -> None:
    # Opening a FIFO blocks until something writes to it: a fingerprint thread would wait
    # forever (a job's timeout cannot stop a thread), and a few such jobs use up the worker's
    # threads. Only regular files are logs, however they are named.
    os.mkfifo(tmp_path / "pipe.log")
    os.mkfifo(tmp_path / "access-2026-03-01T00-00-00.000-size.log")
    (tmp_path / "access.log").write_bytes(line())
    assert [f.path.name for f in discover(tmp_path / "access.log", None)] == ["access.log"]
    with pytest.raises(PermanentError, match="^logs 'pipe.log': no log files found$"):
        resolve_logs(tmp_path, "pipe.log")
