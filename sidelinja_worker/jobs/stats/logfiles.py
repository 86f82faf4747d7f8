"""Caddy's log files on disk: which belong to a log, how to read them as lines, and how to know
a file again after it was rotated (renamed, then gzip- or zstd-compressed).

Every file is opened by `silos.open_in_folder`: a regular file of one link, in the folder it
was listed in, and not a symlink swapped in since it was listed. A live file is read up to
the size it had when opened: what Caddy appends meanwhile is the next run's."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import zstandard
from isal import igzip

from sidelinja_worker.jobs.silos import open_in_folder

# Read, and decoded, a chunk at a time: the ~140 Caddy lines of 128 KiB stay in the CPU cache
# while they are counted; the entries of a 1 MiB chunk did not (1.2-1.5x slower).
CHUNK_BYTES = 1 << 17
# A longer "line" is not a Caddy entry; dropping it keeps memory bounded on a hostile file.
MAX_LINE_BYTES = 1 << 20
FINGERPRINT_BYTES = 4096
# The most of a compressed file read for its fingerprint. A log's first line is in its first
# few KiB; a file of millions of empty gzip or zstd members has none for megabytes, and reading
# on until text came held a worker thread (which no timeout stops) for minutes, every run.
FINGERPRINT_INPUT_BYTES = 1 << 20
# A compressed log expands at most this many times its compressed size (Caddy's JSON lines
# compress 8-30x with gzip or zstd), beyond a floor for small files; past it the file is not
# a log but a decompression bomb, and the parse fails naming it.
MAX_EXPANSION_RATIO = 200
MIN_EXPANSION_BYTES = 16 * 1024 * 1024
# The most history a zstd frame may make its decoder keep (the frame names it, up to libzstd's
# 128 MiB, and the decoder fills it). Caddy's encoder writes 8 MiB windows at most, as do
# zstd's levels 1-19, and 8 MiB is what the format asks every decoder to support; a frame that
# needs more is refused as a damaged file is.
MAX_ZSTD_WINDOW = 8 * 1024 * 1024

# lumberjack (Caddy <= 2.10): access-2024-05-01T12-30-00.000.log[.gz]
# timberjack (Caddy >= 2.11): access-2026-03-01T00-00-00.000-size.log[.gz|.zst]
ROTATED = re.compile(
    r"^(?P<base>.+)-(?P<time>\d{4}-\d\d-\d\dT\d\d-\d\d-\d\d(?:\.\d+)?)"
    r"(?:-(?P<reason>[a-z]+))?(?P<ext>\.[A-Za-z0-9]+)(?P<comp>\.gz|\.zst)?$"
)


def utf8_text(text: str) -> str:
    """`text` as PostgreSQL's text and JSON can hold it: the bytes of a file name that are not
    UTF-8 (which Python keeps as lone surrogates) become U+FFFD. Names and errors of files go
    into the job's result and `podcast_log_files`, and one that cannot be stored failed every
    run (and so stopped the runs' schedule)."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


class NoLogText(Exception):
    """A compressed file with no log line in its first FINGERPRINT_INPUT_BYTES: not read."""


class LogBomb(Exception):
    """A compressed file that expands beyond MAX_EXPANSION_RATIO: refused, naming it."""


def expansion_limit(compressed_size: int) -> int:
    """How many bytes a compressed file of `compressed_size` bytes may expand to."""
    return max(MAX_EXPANSION_RATIO * compressed_size, MIN_EXPANSION_BYTES)


@dataclass(frozen=True, slots=True)
class LogFile:
    path: Path
    rotated: bool  # a rotated file never grows again: its last line is final
    # The folder the file must be opened in (the workspace's media folder); None: its own.
    folder: Path | None = None

    @property
    def compressed(self) -> bool:
        return self.path.suffix in (".gz", ".zst")


def discover(target: Path, pattern: str | None) -> list[LogFile]:
    """The files of a log: `target` a folder (every live `*.log` and rotated file in it), a
    live file (it and its rotated siblings), or with `pattern` a glob under `target`. Rotated
    files come first, oldest first, so counts grow in time order."""
    if pattern is not None:
        paths = [p for p in target.glob(pattern) if p.is_file()]
    elif target.is_dir():
        paths = [
            p
            for p in target.iterdir()
            if p.is_file() and (p.suffix == ".log" or ROTATED.match(p.name))
        ]
    else:  # only regular files: opening a named pipe would wait for a writer, forever
        paths = [p for p in (target, *_rotated_siblings(target)) if p.is_file()]
    files = [LogFile(p, ROTATED.match(p.name) is not None) for p in paths]
    return sorted(files, key=lambda f: (not f.rotated, _rotation_time(f.path), f.path.name))


def _rotated_siblings(live: Path) -> list[Path]:
    stem, ext = live.stem, live.suffix
    return [
        p
        for p in live.parent.glob(f"{stem}-*{ext}*")
        if (m := ROTATED.match(p.name)) and m["base"] == stem and m["ext"] == ext
    ]


def _rotation_time(path: Path) -> str:
    match = ROTATED.match(path.name)
    return match["time"] if match else ""


# What the readers below take: any binary stream that can `readinto` a buffer.
Stream = io.BufferedIOBase | io.RawIOBase


def open_raw(path: Path, folder: Path | None = None) -> BinaryIO:
    """The file as it is on disk, opened in `folder` (default: its own) by `open_in_folder`."""
    return open_in_folder(folder or path.parent.resolve(), path)


def open_stream(path: Path, folder: Path | None = None) -> Stream:
    """The file's log text as a binary stream, decompressed as it is read (bounded memory)."""
    return decompress(open_raw(path, folder), path.suffix)


def decompress(raw: BinaryIO, suffix: str) -> Stream:
    """`raw`'s log text by the file's suffix; closing the stream closes `raw`."""
    if suffix == ".gz":
        return io.BufferedReader(GzipReader(raw), CHUNK_BYTES)
    if suffix == ".zst":
        return zstandard.ZstdDecompressor(max_window_size=MAX_ZSTD_WINDOW).stream_reader(
            raw, read_across_frames=True, closefd=True
        )  # type: ignore[return-value]
    return raw  # type: ignore[return-value]


class GzipReader(io.RawIOBase):
    """A gzip file's text, decompressed by ISA-L's igzip: 3.1x the stdlib's zlib here (1,575 vs
    501 MB/s; ~1.3 us less per ~950-byte line, a quarter of a rotated file's parse).

    igzip drops what it had decompressed of its last input buffer when it meets damage, where
    the stdlib yields everything up to it. So on any error it reads again with the stdlib's
    gzip from where it got to, and a damaged file gives the same lines and error as before."""

    def __init__(self, raw: BinaryIO) -> None:
        super().__init__()
        self._raw = raw
        self._stream: io.BufferedIOBase = igzip.IGzipFile(fileobj=raw)
        self._fallback = False
        self._pos = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        try:
            got = self._stream.readinto(buffer)
        except Exception:
            if self._fallback:
                raise
            got = self._fall_back(buffer)
        self._pos += got
        return got

    def _fall_back(self, buffer: bytearray | memoryview) -> int:
        self._stream.close()
        self._fallback = True
        self._raw.seek(0)  # the same open file, read again from its start
        self._stream = gzip.GzipFile(fileobj=self._raw)
        _skip(self._stream, self._pos, compressed=True)
        return self._stream.readinto(buffer)

    def close(self) -> None:
        if not self.closed:
            self._stream.close()
            self._raw.close()
        super().close()


def fingerprint(path: Path, folder: Path | None = None) -> str | None:
    """Identifies the log text, not the file: a hash of its first line (or first 4 KiB), which
    stays the same through rename and compression. None while no complete line exists yet.
    A compressed file is read from its first FINGERPRINT_INPUT_BYTES only: NoLogText when
    they hold no line and the file goes on past them."""
    with open_raw(path, folder) as raw:
        if path.suffix not in (".gz", ".zst"):
            head = raw.read(FINGERPRINT_BYTES)
            more = False
        else:
            data = raw.read(FINGERPRINT_INPUT_BYTES)
            more = bool(raw.read(1))
            head = _compressed_head(data, path.suffix, more)
    cut = head.find(b"\n")
    if cut < 0 and len(head) < FINGERPRINT_BYTES:
        if more:
            raise NoLogText(
                f"no log line in its first {FINGERPRINT_INPUT_BYTES:,} compressed bytes: "
                "not a log, not read"
            )
        return None
    first = head if cut < 0 else head[: cut + 1]
    return hashlib.sha256(first).hexdigest()[:32]


def _compressed_head(data: bytes, suffix: str, more: bool) -> bytes:
    """The first FINGERPRINT_BYTES of text in `data`, the start of a compressed file. Where
    the file goes on past `data`, the end of `data` is no damage: what came before it counts."""
    with decompress(io.BytesIO(data), suffix) as stream:
        try:
            return stream.read(FINGERPRINT_BYTES)
        except (EOFError, OSError, zstandard.ZstdError):
            if more:
                return b""
            raise


def read_blocks(log: LogFile, start: int) -> Iterator[tuple[memoryview, int]]:
    """Complete lines from byte `start` of the log text, as blocks of whole lines (about
    CHUNK_BYTES each, newline-terminated), each with the offset just past it. A live file's
    unterminated last line is still being written: it is left for the next run, which resumes at
    the last offset yielded; a rotated file's is final and comes as the last block. A plain
    file is read up to the size it had when opened: Caddy appending faster than the parse reads
    would keep the run from ever ending (its offsets are committed only at its end).

    A block is a view into one reused buffer, valid until the next block is asked for: the
    file is read into it (no bytes object per chunk, and none per line: the decoder takes the
    whole block in one call). Joining each chunk to the previous one's unfinished line copied
    every byte once more, ~4 % of a parse's instructions (callgrind)."""
    raw = open_raw(log.path, log.folder)
    with raw, decompress(raw, log.path.suffix) as stream:
        size = os.fstat(raw.fileno()).st_size  # of the file opened, not of the name now
        limit = expansion_limit(size) if log.compressed else None
        _skip(stream, start, log.compressed)
        _check_expansion(log, start, limit)
        left = None if log.compressed else max(size - start, 0)
        buf = bytearray(2 * CHUNK_BYTES)
        view = memoryview(buf)
        offset, kept = start, 0  # kept: bytes of an unfinished line at the front of buf
        while True:
            if len(buf) - kept < CHUNK_BYTES:  # a long unfinished line: a bigger buffer
                # A new one, as the caller may still hold a view of this one (no resizing).
                buf = bytearray(2 * len(buf))
                buf[:kept] = view[:kept]
                view = memoryview(buf)
            want = CHUNK_BYTES if left is None else min(CHUNK_BYTES, left)
            got = stream.readinto(view[kept : kept + want]) if want else 0
            if not got:
                break
            if left is not None:
                left -= got
            if limit is not None:
                _check_expansion(log, offset + kept + got, limit)
            filled = kept + got
            end = buf.rfind(b"\n", kept, filled) + 1
            if end == 0:  # no line ends in it yet
                kept = filled
                if kept > MAX_LINE_BYTES:  # not a Caddy entry: dropped, memory stays bounded
                    offset, kept = offset + kept, 0
                continue
            offset += end
            yield view[:end], offset
            kept = filled - end
            view[:kept] = buf[end:filled]  # the unfinished line (a copy) to the front
        if kept and log.rotated:
            yield view[:kept], offset + kept


def _check_expansion(log: LogFile, decompressed: int, limit: int | None) -> None:
    if limit is not None and decompressed > limit:
        raise LogBomb(
            f"{utf8_text(log.path.name)} expands to more than {limit} bytes ({MAX_EXPANSION_RATIO} times "
            "its compressed size): not a log, refused"
        )


def read_batches(log: LogFile, start: int) -> Iterator[tuple[list[bytes], int]]:
    """`read_blocks` as lists of lines (without their newlines), for callers that want lines."""
    for block, offset in read_blocks(log, start):
        lines = bytes(block).split(b"\n")
        if not lines[-1]:
            lines.pop()  # after the block's final newline
        yield lines, offset


def _skip(stream: Stream, count: int, compressed: bool) -> None:
    if not compressed:
        stream.seek(count)
        return
    left = count
    while left > 0:  # a compressed stream is decompressed up to where the last run stopped
        got = len(stream.read(min(left, CHUNK_BYTES)))
        if got == 0:
            return
        left -= got
