"""Step 2 of the IAB process: how many bytes of an episode make a download (its ID3 header plus
one minute of audio), from the media file when it is at hand, else the whole file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

from sidelinja_worker.jobs.silos import open_in_folder

MINUTE_S = 60


def threshold_bytes(
    media_file: Path | None, size_from_log: int | None, folder: Path | None = None
) -> int | None:
    """The bytes a listener must receive: ID3 + 60 s at the file's bitrate when the file can be
    read (mutagen), else the whole file as the logs report its size (IAB: 100% when the sizes
    cannot be computed), else None (then a whole 200 response is the rule). The file is opened
    in `folder` (default: its own) by `open_in_folder`: one it refuses (a hard link, no
    regular file, a symlink swapped in) is not read, as a missing one."""
    if media_file is None:
        return size_from_log
    try:
        audio = open_in_folder(folder or media_file.parent.resolve(), media_file)
    except OSError:
        return size_from_log
    with audio:
        size = os.fstat(audio.fileno()).st_size
        bitrate_bps, length_s = _audio_info(audio)
        if bitrate_bps and length_s >= MINUTE_S:
            return min(size, id3_size(audio) + bitrate_bps * MINUTE_S // 8)
        return size  # shorter than a minute, or unreadable: the complete file


def _audio_info(audio: BinaryIO) -> tuple[int, float]:
    try:
        import mutagen  # optional: without it the whole file is the threshold
    except ImportError:
        return 0, 0.0
    try:
        parsed = mutagen.File(audio)
    except Exception:  # mutagen raises many types on odd files; any of them means "unknown"
        return 0, 0.0
    if parsed is None or parsed.info is None:
        return 0, 0.0
    info = parsed.info
    return int(getattr(info, "bitrate", 0) or 0), float(getattr(info, "length", 0) or 0)


def id3_size(f: BinaryIO) -> int:
    """Bytes of the ID3v2 tag at the start of the file (header, frames, footer), 0 if none."""
    f.seek(0)
    head = f.read(10)
    if len(head) < 10 or head[:3] != b"ID3":
        return 0
    body = (head[6] << 21) | (head[7] << 14) | (head[8] << 7) | head[9]  # syncsafe integer
    footer = 10 if head[5] & 0x10 else 0
    return 10 + body + footer
