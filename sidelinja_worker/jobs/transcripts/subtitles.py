"""SRT in, transcript out: segments, plain text and WebVTT. Pure functions, no I/O.

The parser is our own, one pass over the lines with anchored, non-nested patterns applied to
one line at a time: its time is linear in the file's size whatever the file holds, and it
names the first line that is wrong and why, so that a person can fix a file in one pass."""

from __future__ import annotations

import asyncio
import html
import re
from dataclasses import dataclass

# Markup that players show as formatting, never as words: HTML-ish tags and ASS override blocks.
# Neither pattern can cross the character that starts it, so a scan is linear.
_TAG = re.compile(r"<[^<>\n]*>|\{\\[^{}\n]*\}")
_SPACES = re.compile(r"[ \t\u00a0]+")
# Delimiters players accept between seconds and milliseconds, fullwidth ones included.
_DELIM = "[,.:\uff0c\uff0e\u3002\uff1a]"
_TS = re.compile(rf"(\d+){_DELIM}(\d+){_DELIM}(\d+)(?:{_DELIM}(\d*))?")
_ARROW = re.compile(r"-[ -] *>")  # "-->", and "- >" that some editors write
_TIMING = re.compile(rf"\s*({_TS.pattern}) *-[ -] *> *({_TS.pattern})(?:\s.*)?")
_WRONG_ARROW = re.compile(r"[-=\u2013\u2014\u2212]*>|-+")
_INDEX = re.compile(r"\s*-?\d+(?:\.\d*)?\s*")
_LOOKS_TIMED = re.compile(r"\s*\d{1,3}[:.,]\d")
# A cue's line is a sentence or two; a longer one is not a subtitle (and is refused before any
# pattern looks at it).
MAX_LINE_CHARS = 20_000
# Lines and cues in a file: ten hours of speech are some 15,000 cues in 60,000 lines, and the
# 20 MB cap some 130 hours. Each line becomes a string before the cues are read (a 20 MB file
# of short lines: 7 million strings, 480 MB), so the lines are counted first; each cue becomes
# a segment (900,000 minimal ones: 280 MB).
MAX_LINES = 1_000_000
MAX_CUES = 200_000
# Digits in one number of a timestamp: 9 keep any time under 2^53 ms (BIGINT, JSON).
MAX_TIMESTAMP_DIGITS = 9
# A pause this long between cues starts a new paragraph in the plain text.
PARAGRAPH_GAP_MS = 2000
# Parsing runs in a thread with this limit: linear, so it is far inside it for any file that
# passes the size cap, but the loop never waits on the parser whatever happens.
PARSE_TIMEOUT_S = 60.0


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
    """Tolerates a BOM, CRLF or CR line ends, a missing final newline, multi-line cues, cues
    without a number, a blank line inside a cue and stray markup; cues left empty by removing
    markup are dropped."""
    text = text.lstrip("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    nul = text.find("\x00")
    if nul >= 0:  # a binary file, or text PostgreSQL could not store
        raise SrtError(text.count("\n", 0, nul) + 1, "a NUL character: not text")
    if text.count("\n") > MAX_LINES:
        raise SrtError(MAX_LINES + 1, f"more than {MAX_LINES:,} lines: not a transcript")
    segments = []
    for number, start_ms, end_ms, lines in _cues(text.split("\n")):
        if end_ms < start_ms:
            raise SrtError(
                number,
                f"the cue ends ({_clock(end_ms)}) before it starts ({_clock(start_ms)})",
            )
        cleaned = clean_text("\n".join(lines))
        if cleaned:
            segments.append(Segment(start_ms, end_ms, cleaned))
    return Transcript(tuple(segments))


async def parse_srt_off_loop(text: str, timeout_s: float = PARSE_TIMEOUT_S) -> Transcript:
    """`parse_srt` in a thread: a big file never stalls the event loop, and a parse that
    overruns `timeout_s` is reported (its thread finishes on its own; the parse is linear)."""
    try:
        return await asyncio.wait_for(asyncio.to_thread(parse_srt, text), timeout_s)
    except TimeoutError:
        raise SrtError(1, f"parsing took more than {timeout_s:g} s") from None


def _cues(lines: list[str]) -> list[tuple[int, int, int, list[str]]]:
    """(timing line number, start ms, end ms, text lines) of each cue, in order."""
    cues: list[tuple[int, int, int, list[str]]] = []
    text: list[str] | None = None  # the current cue's text lines; None before the first cue
    block_start = True  # after a blank line (or at the top)
    count = len(lines)
    i = 0
    while i < count:
        line = lines[i]
        number = i + 1
        if len(line) > MAX_LINE_CHARS:
            raise SrtError(
                number, f"the line is {len(line)} characters long (at most {MAX_LINE_CHARS})"
            )
        i += 1
        if not line.strip():
            block_start = True
            if text is not None:
                text.append("")
            continue
        timing = _TIMING.fullmatch(line)
        if timing is None and _INDEX.fullmatch(line) and (block_start or _next_is_timing(lines, i)):
            if i >= count or not lines[i].strip():
                if all(not rest.strip() for rest in lines[i:]):  # once, on the way out
                    raise SrtError(
                        number, "the file ends after the cue number, without its timing line"
                    )
                raise SrtError(i + 1, "a timing line is missing after the cue number")
            nxt = lines[i]
            if len(nxt) > MAX_LINE_CHARS or _TIMING.fullmatch(nxt) is None:
                raise SrtError(i + 1, _timing_problem(nxt, after_index=True))
            line, number, timing = nxt, i + 1, _TIMING.fullmatch(nxt)
            i += 1
        if timing is not None:
            if len(cues) >= MAX_CUES:
                raise SrtError(number, f"more than {MAX_CUES:,} cues: not a transcript")
            text = []
            cues.append((number, _ms(timing, 1, number), _ms(timing, 6, number), text))
            block_start = False
            continue
        if _LOOKS_TIMED.match(line) and ">" in line[:100]:
            raise SrtError(number, _timing_problem(line, after_index=False))
        if text is None or (block_start and "->" in line):
            raise SrtError(number, f"expected a cue number and timing line, got {_quote(line)}")
        text.append(line)
        block_start = False
    return cues


def _next_is_timing(lines: list[str], i: int) -> bool:
    return i < len(lines) and len(lines[i]) <= MAX_LINE_CHARS and bool(_TIMING.fullmatch(lines[i]))


def _timing_problem(line: str, *, after_index: bool) -> str:
    """Why `line`, where a timing line belongs, is not one: the first thing wrong in it."""
    shown = _quote(line)
    arrow = _ARROW.search(line)
    if arrow is None:
        wrong = _WRONG_ARROW.search(line.strip(), 1) if line.strip() else None
        if wrong is not None and _TS.match(line.strip()):
            return f"wrong arrow {wrong.group()!r} in timing line {shown} (expected '-->')"
        if after_index:
            return f"expected a timing line after the cue number, got {shown}"
        return f"no '-->' in timing line {shown}"
    for side in (line[: arrow.start()].strip(), (line[arrow.end() :].split() or [""])[0]):
        if not _TS.fullmatch(side):
            letter = next((c for c in side if c.isalpha()), None)
            if letter is not None:
                return f"a letter {letter!r} inside the timestamp {_quote(side)} of {shown}"
            return f"bad timestamp {_quote(side)} in timing line {shown} (expected HH:MM:SS,mmm)"
    return f"bad timing line {shown}"


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


def _ms(timing: re.Match[str], group: int, line: int) -> int:
    """Milliseconds of the timestamp whose hours are `group` (minutes, seconds and the
    fraction follow); the fraction's digits are read as milliseconds, as players do. A number
    of more than MAX_TIMESTAMP_DIGITS is refused: past 4,300 digits int() raises a plain
    ValueError, and 16 digits of hours are past the BIGINT columns the times are stored in."""
    numbers = timing.group(group + 1, group + 2, group + 3, group + 4)
    longest = max(len(n or "") for n in numbers)
    if longest > MAX_TIMESTAMP_DIGITS:
        raise SrtError(
            line,
            f"a number of {longest} digits in the timestamp {_quote(timing.group(group))} "
            f"(at most {MAX_TIMESTAMP_DIGITS})",
        )
    hours, minutes, seconds, millis = numbers
    return ((int(hours) * 60 + int(minutes)) * 60 + int(seconds)) * 1000 + int(millis or 0)


def _clock(ms: int) -> str:
    return vtt_time(ms).replace(".", ",")


def _quote(line: str) -> str:
    line = line.strip()
    return repr(line if len(line) <= 60 else line[:57] + "...")
