"""Text from the database, made safe to print on a terminal.

Job types, error messages and progress reports are any text a plain-SQL writer (or a job's own
input, quoted in its error) puts there: an escape sequence in one would retitle, clear or
restyle the operator's terminal, and a line break or bidi override would misalign or reverse
what a table shows. Such characters are printed as their Python escapes (`\\x1b`)."""

from __future__ import annotations

import re

from rich.text import Text

# C0 and C1 controls and DEL, and the bidi embeddings, overrides and isolates; in JSON text all
# but C0, which json.dumps escapes inside strings (outside them are its own line breaks).
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_UNSAFE_IN_JSON = re.compile(r"[\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(value: object) -> str:
    """str(value) with every control and bidi character as its escape."""
    return _UNSAFE.sub(lambda m: m[0].encode("unicode_escape").decode(), str(value))


def plain(value: object) -> Text:
    """A rich cell of printable(value), never read as markup ("[/]" is text, not a tag)."""
    return Text(printable(value))


def printable_json(text: str) -> str:
    """JSON text (json.dumps escapes C0 controls already) with DEL, C1 and bidi characters as
    JSON escapes (`\\u009b`): still JSON that reads back to the same values."""
    return _UNSAFE_IN_JSON.sub(lambda m: f"\\u{ord(m[0]):04x}", text)
