"""Listener totals spilled to sorted files, so that a parse's memory stays bounded when every
line is a new listener (a flood of unique addresses and user agents aimed at an episode).

A run file holds one sorted batch of records in chunks: a 4-byte length, then a msgpack array
of records. Runs are merged in key order into one file of the same form, equal keys summed:
the same totals an in-memory parse gives, read back a chunk at a time."""

from __future__ import annotations

import heapq
import struct
from collections.abc import Iterable, Iterator
from operator import itemgetter
from pathlib import Path
from typing import BinaryIO

import msgspec

# (day, episode, IP key, User-Agent, app family, bytes, whole)
Record = tuple[int, str, str, str, str, int, bool]

CHUNK_RECORDS = 2000  # per chunk read or written: a merge holds one chunk per run
# A listener's bytes of an episode in a day stop here, as PostgreSQL's BIGINT does: sums of
# many lines (the file's numbers are bounded a line, not a listener) went past it, and past
# msgpack's integers, and failed the run, every run.
MAX_LISTENER_BYTES = (1 << 63) - 1
_LENGTH = struct.Struct("<I")
_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(list[tuple[int, str, str, str, str, int, bool]])
_KEY = itemgetter(0, 1, 2, 3)


def write_records(path: Path, records: Iterable[Record]) -> int:
    """Writes `records` (already in key order) in chunks; returns how many."""
    count = 0
    with path.open("wb") as out:
        chunk: list[Record] = []
        for record in records:
            chunk.append(record)
            if len(chunk) >= CHUNK_RECORDS:
                count += _write_chunk(out, chunk)
                chunk = []
        if chunk:
            count += _write_chunk(out, chunk)
    return count


def _write_chunk(out: BinaryIO, chunk: list[Record]) -> int:
    data = _ENCODER.encode(chunk)
    out.write(_LENGTH.pack(len(data)))
    out.write(data)
    return len(chunk)


def read_chunks(path: Path) -> Iterator[list[Record]]:
    """The file's records, a chunk at a time."""
    with path.open("rb") as src:
        while header := src.read(_LENGTH.size):
            (size,) = _LENGTH.unpack(header)
            yield _DECODER.decode(src.read(size))


def read_records(path: Path) -> Iterator[Record]:
    for chunk in read_chunks(path):
        yield from chunk


def merge_runs(runs: list[Path], out: Path) -> int:
    """Merges sorted runs into `out`: one record per key, bytes summed, `whole` if any was, the
    first app family found. Returns the number of records written."""
    merged = heapq.merge(*(read_records(r) for r in runs), key=_KEY)
    return write_records(out, _combine(merged))


def _combine(records: Iterator[Record]) -> Iterator[Record]:
    current: Record | None = None
    for record in records:
        if current is not None and _KEY(current) == _KEY(record):
            current = (
                *current[:4],
                current[4] or record[4],
                min(current[5] + record[5], MAX_LISTENER_BYTES),
                current[6] or record[6],
            )  # type: ignore[assignment]
            continue
        if current is not None:
            yield current
        current = record
    if current is not None:
        yield current
