"""Step 2 of the IAB process: how many bytes of an episode make a download (its ID3 header plus
one minute of audio), from the media file when it is at hand, else the whole file."""

from __future__ import annotations

from pathlib import Path

MINUTE_S = 60


def threshold_bytes(media_file: Path | None, size_from_log: int | None) -> int | None:
    """The bytes a listener must receive: ID3 + 60 s at the file's bitrate when the file can be
    read (mutagen), else the whole file as the logs report its size (IAB: 100% when the sizes
    cannot be computed), else None (then a whole 200 response is the rule)."""
    if media_file is not None and media_file.is_file():
        size = media_file.stat().st_size
        bitrate_bps, length_s = _audio_info(media_file)
        if bitrate_bps and length_s >= MINUTE_S:
            return min(size, id3_size(media_file) + bitrate_bps * MINUTE_S // 8)
        return size  # shorter than a minute, or unreadable: the complete file
    return size_from_log


def _audio_info(path: Path) -> tuple[int, float]:
    try:
        import mutagen  # optional: without it the whole file is the threshold
    except ImportError:
        return 0, 0.0
    try:
        audio = mutagen.File(path)
    except Exception:  # mutagen raises many types on odd files; any of them means "unknown"
        return 0, 0.0
    if audio is None or audio.info is None:
        return 0, 0.0
    return int(getattr(audio.info, "bitrate", 0) or 0), float(getattr(audio.info, "length", 0) or 0)


def id3_size(path: Path) -> int:
    """Bytes of the ID3v2 tag at the start of the file (header, frames, footer), 0 if none."""
    with path.open("rb") as f:
        head = f.read(10)
    if len(head) < 10 or head[:3] != b"ID3":
        return 0
    body = (head[6] << 21) | (head[7] << 14) | (head[8] << 7) | head[9]  # syncsafe integer
    footer = 10 if head[5] & 0x10 else 0
    return 10 + body + footer
