"""SRT in, transcript out: segments, plain text and WebVTT. Pure functions, no I/O."""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from datetime import timedelta

import srt

# Markup that players show as formatting, never as words: HTML-ish tags and ASS override blocks.
_TAG = re.compile(r"<[^<>\n]*>|\{\\[^{}\n]*\}")
_SPACES = re.compile(r"[ \t\u00a0]+")
# The library's own timestamp and index patterns, so this check never rejects what it accepts.
_TIMING = re.compile(rf"^\s*{srt.RGX_TIMESTAMP}\s*-->\s*{srt.RGX_TIMESTAMP}")
_INDEX = re.compile(rf"^\s*{srt.RGX_INDEX}\s*$")
_LOOKS_TIMED = re.compile(r"^\s*\d+:\d+\S*\s*-+>")
# A pause this long between cues starts a new paragraph in the plain text.
PARAGRAPH_GAP_MS = 2000


class SrtError(ValueError):
    """A malformed SRT; the message names the line (1-based) where it goes wrong."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"malformed SRT at line {line}: {message}")
        self.line = line


@dataclass(frozen=True, slots=True)
class Segment:
    start_ms: int
    end_ms: int
    text: str  # markup removed; the cue's line breaks kept as "\n"


@dataclass(frozen=True)
class Transcript:
    segments: tuple[Segment, ...]

    @property
    def duration_ms(self) -> int:
        return max((s.end_ms for s in self.segments), default=0)

    @property
    def plain_text(self) -> str:
        return plain_text(self.segments)

    @property
    def webvtt(self) -> str:
        return webvtt(self.segments)


def parse_srt(text: str) -> Transcript:
    """Tolerates a BOM, CRLF or CR line ends, a missing final newline, multi-line cues and stray
    markup; cues left empty by removing markup are dropped."""
    text = text.lstrip("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    _check_blocks(text)
    try:
        cues = list(srt.parse(text))
    except srt.SRTParseError as exc:
        raise _locate(text, exc) from None
    segments = []
    for number, cue in enumerate(cues, start=1):
        start_ms, end_ms = _ms(cue.start), _ms(cue.end)
        if end_ms < start_ms:
            raise SrtError(_timing_line(text, number), f"cue {cue.index} ends before it starts")
        cleaned = clean_text(cue.content)
        if cleaned:
            segments.append(Segment(start_ms, end_ms, cleaned))
    return Transcript(tuple(segments))


def clean_text(content: str) -> str:
    """The cue's words: tags and entities gone, spaces collapsed, blank lines dropped."""
    lines = (
        _SPACES.sub(" ", html.unescape(_TAG.sub("", ln))).strip() for ln in content.split("\n")
    )
    return "\n".join(ln for ln in lines if ln)


def plain_text(segments: tuple[Segment, ...]) -> str:
    paragraphs: list[list[str]] = []
    previous_end = None
    for seg in segments:
        if previous_end is None or seg.start_ms - previous_end >= PARAGRAPH_GAP_MS:
            paragraphs.append([])
        paragraphs[-1].append(seg.text.replace("\n", " "))
        previous_end = seg.end_ms
    return "\n\n".join(" ".join(p) for p in paragraphs)


def webvtt(segments: tuple[Segment, ...]) -> str:
    cues = []
    for seq, seg in enumerate(segments, start=1):
        # "-->" would end the cue's text early, and <, & start markup in WebVTT.
        body = html.escape(seg.text.replace("-->", "→"), quote=False)
        cues.append(f"{seq}\n{vtt_time(seg.start_ms)} --> {vtt_time(seg.end_ms)}\n{body}\n")
    return "\n".join(["WEBVTT\n", *cues])


def vtt_time(ms: int) -> str:
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    seconds, millis = divmod(rest, 1000)
    return f"{hours:02d}:{minutes:02d}:{seconds:02d}.{millis:03d}"


def _ms(delta: timedelta) -> int:
    return delta // timedelta(milliseconds=1)


def _check_blocks(text: str) -> None:
    """Walks the blocks the way a player reads them, to name the first broken line. A block
    that is neither a cue nor plausible cue text (a blank line inside a cue is tolerated) fails."""
    in_cue, block_start, after_index = False, True, False
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            block_start, after_index = True, False
            continue
        timing = _TIMING.match(line)
        if not timing and _LOOKS_TIMED.match(line):
            raise SrtError(number, f"bad timing line {_quote(line)}")
        if after_index and not timing:
            raise SrtError(
                number, f"expected a timing line after the cue number, got {_quote(line)}"
            )
        if after_index or (block_start and timing):
            in_cue, block_start, after_index = True, False, False
            continue
        if block_start and _INDEX.match(line):
            block_start, after_index = False, True
            continue
        if block_start and (not in_cue or "->" in line):
            raise SrtError(number, f"expected a cue number and timing line, got {_quote(line)}")
        block_start = False


def _locate(text: str, exc: srt.SRTParseError) -> SrtError:
    """What the library rejected after our own check passed: name where its match stopped."""
    number = text.count("\n", 0, exc.expected_start) + 1
    rest = text[exc.expected_start :].lstrip("\n")
    return SrtError(number, f"cannot read the cue starting {_quote(rest.split(chr(10), 1)[0])}")


def _timing_line(text: str, cue_number: int) -> int:
    seen = 0
    for number, line in enumerate(text.split("\n"), start=1):
        if "-->" in line:
            seen += 1
            if seen == cue_number:
                return number
    return 1


def _quote(line: str) -> str:
    line = line.strip()
    return repr(line if len(line) <= 60 else line[:57] + "...")
