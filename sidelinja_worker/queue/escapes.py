"""Text from outside (rows, payloads, services' answers) made safe to write to a terminal.

Job types, error messages and progress reports are any text a plain-SQL writer, a job's own
input or an outside service's answer puts there: an escape sequence in one would retitle, clear
or restyle the operator's terminal, and a line break or bidi override would start a line that
reads like the worker's own, or reverse what a table shows. Such characters are written as their
Python escapes (`\\x1b`), or in JSON as JSON escapes."""

from __future__ import annotations

import re

# C0 and C1 controls and DEL, and the bidi embeddings, overrides and isolates; in JSON text all
# but C0, which JSON escapes inside strings (outside them are its own line breaks).
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_UNSAFE_IN_JSON = re.compile(r"[\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
# The same but the line break, for text whose lines are its own (a traceback).
_UNSAFE_IN_LINES = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    return match[0].encode("unicode_escape").decode()


def printable(value: object) -> str:
    """str(value) with every control and bidi character as its escape: one line."""
    return _UNSAFE.sub(_escape, str(value))


def printable_lines(text: str) -> str:
    """`text` with every control and bidi character but the line break as its escape."""
    return _UNSAFE_IN_LINES.sub(_escape, text)


def printable_json(text: str) -> str:
    """JSON text (C0 controls escaped already) with DEL, C1 and bidi characters as JSON
    escapes (`\\u009b`): still JSON that reads back to the same values."""
    return _UNSAFE_IN_JSON.sub(lambda m: f"\\u{ord(m[0]):04x}", text)
