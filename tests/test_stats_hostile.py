"""stats_parse against hostile logs, without the database: what a parse keeps of a line is
bounded whatever the line holds."""

from __future__ import annotations

import gzip
import pickle
from pathlib import Path
from typing import Any, BinaryIO

import pytest
import zstandard

from sidelinja_worker.jobs.silos import open_in_folder
from sidelinja_worker.jobs.stats import counting, logfiles
from sidelinja_worker.jobs.stats.counting import EpisodeRules, Tally
from sidelinja_worker.jobs.stats.parse import FileTask, parse_files
from tests.test_stats_counting import APPLE, EP, SPOTIFY, line

LONG = 100_000  # characters of a hostile field: far past every bound, far below a line's


def _long(tag: str) -> str:
    return tag + "x" * LONG


def test_long_fields_are_not_kept_whole(tmp_path: Path) -> None:
    # Each line below MAX_LINE_BYTES, each field kept whole: the parse held every one, in its
    # caches and listener keys, and pickled them all to the worker (1,500 lines of a 1 MiB
    # client_ip: 1.4 GB pickled, the worker at 3.3 GB).
    lines = [
        *(line(ip=_long(f"198.51.100.{i}")) for i in range(3)),  # no address: bad lines
        *(line(ip=f"198.51.100.{i}", ua=_long(SPOTIFY + str(i))) for i in range(3)),
        line(ip="198.51.100.9", ua=_long(SPOTIFY + "0")),  # the same agent as above
        line(uri=EP + "?q=" + "x" * LONG),  # a long query string: counted
        line(uri="/" + "x" * LONG + ".mp3"),  # a long path: no episode
        line(ip="198.51.100.10", range_="bytes=0-" + "9" * LONG),  # no probe: counted
    ]
    log = tmp_path / "access.log"
    log.write_bytes(b"".join(lines))
    result = parse_files([FileTask(log, False, "fp", 0)], EpisodeRules(), tmp_path, 100_000)
    sent = len(pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL))
    assert sent < 20_000, f"{sent} bytes pickled to the worker"
    assert (result.bad_lines, result.counted_requests) == (3, 6)
    agents = {key[3] for key in result.listens}
    assert {len(a) for a in agents} == {len(APPLE), counting.MAX_AGENT_CHARS}
    assert len(agents) == 4 and list(result.paths) == [EP]
    assert all(result.families[a] == "Spotify" for a in agents if a != APPLE)


def test_the_caches_hold_no_long_value() -> None:
    t = Tally(EpisodeRules(hosts=("pod.example.no",)))
    hostile = [
        line(ip=_long("198.51.100.1")),
        line(ua=_long(SPOTIFY)),
        line(uri=EP + "?q=" + "x" * LONG),
        line(range_="bytes=0-" + "9" * LONG),
    ]
    t.add_block(b"".join(hostile))
    t.add_block(line().replace(b'"pod.example.no"', b'"' + b"h" * LONG + b'"'))
    caches = (t._uris, t._agents, t._ips, t._probes, t._hosts)
    longest = max(len(key) for cache in caches for key in cache)
    assert longest <= 1024, f"a cache key of {longest} characters"
    assert t.counted_requests == 3 and t.bad_lines == 1


def test_distinct_agents_spill_by_their_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Few listeners, each with its own long agent: spilling only by listener count kept them
    # all in memory.
    monkeypatch.setattr(counting, "SPILL_AGENT_BYTES", 8 * 1024)
    t = Tally(EpisodeRules(), spill_at=100_000, spill_dir=tmp_path)
    for i in range(20):
        t.add_block(line(ua=f"{SPOTIFY} {i:04d} " + "x" * 1000))
    assert len(t.runs) >= 2 and len(t.listens) < 20
    assert t.agent_bytes < 8 * 1024 + counting.MAX_AGENT_CHARS


class _Counted:
    """A file that counts the bytes read from it."""

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self.read_bytes = 0

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(size)
        self.read_bytes += len(data)
        return data

    def readinto(self, buffer: bytearray | memoryview) -> int:
        got = self._raw.readinto(buffer)  # type: ignore[attr-defined]
        self.read_bytes += got
        return int(got)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)

    def __enter__(self) -> _Counted:
        return self

    def __exit__(self, *exc: object) -> None:
        self._raw.close()


@pytest.mark.parametrize("kind", ["gz", "gz-damaged", "zst"])
def test_a_fingerprint_reads_a_bounded_head_of_empty_members(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    # Empty members before the first line: the fingerprint read on until text came (and a
    # damaged tail re-read it all with the stdlib's gzip), minutes of a worker thread for a
    # file of millions of them, every run.
    empty = gzip.compress(b"") if kind.startswith("gz") else zstandard.compress(b"")
    members = 2 * (1 << 20) // len(empty)  # 2 MiB of them, twice the cap
    tail = line() if kind != "gz-damaged" else gzip.compress(line())[:-9] + b"junk"
    if kind.startswith("gz") and kind != "gz-damaged":
        tail = gzip.compress(tail)
    elif kind == "zst":
        tail = zstandard.compress(tail)
    suffix = "zst" if kind == "zst" else "gz"
    path = tmp_path / f"access-2026-03-01T00-00-00.000.log.{suffix}"
    path.write_bytes(empty * members + tail)
    opened: list[_Counted] = []

    def counted(path: Path, folder: Path | None = None) -> BinaryIO:
        raw = _Counted(open_in_folder(folder or path.parent.resolve(), path))
        opened.append(raw)
        return raw  # type: ignore[return-value]

    monkeypatch.setattr(logfiles, "open_raw", counted)
    with pytest.raises(Exception, match="no log line in its first 1,048,576 compressed bytes"):
        logfiles.fingerprint(path)
    assert sum(f.read_bytes for f in opened) <= (1 << 20) + 1
