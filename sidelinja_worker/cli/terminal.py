"""Text from the database, made safe to print on a terminal (see queue.escapes), as rich cells."""

from __future__ import annotations

from rich.text import Text

from sidelinja_worker.queue.escapes import printable


def plain(value: object) -> Text:
    """A rich cell of printable(value), never read as markup ("[/]" is text, not a tag)."""
    return Text(printable(value))
