"""Loads named-block SQL files (sql/queries.sql and its siblings) into statements, once, at import."""

from __future__ import annotations

import re
from importlib import resources

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def load(file_name: str) -> dict[str, str]:
    """The `-- name: x` blocks of sql/<file_name>, by name."""
    text = resources.files("sidelinja_worker").joinpath(f"sql/{file_name}").read_text("utf-8")
    pieces = _NAME.split(text)
    # pieces = [preamble, name1, body1, name2, body2, ...]
    return {name: body.strip() for name, body in zip(pieces[1::2], pieces[2::2], strict=True)}


QUERIES: dict[str, str] = load("queries.sql")
