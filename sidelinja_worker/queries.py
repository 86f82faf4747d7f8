"""Loads sql/queries.sql into named statements, once, at import."""

from __future__ import annotations

import re
from importlib import resources

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def _load() -> dict[str, str]:
    text = resources.files("sidelinja_worker").joinpath("sql/queries.sql").read_text("utf-8")
    pieces = _NAME.split(text)
    # pieces = [preamble, name1, body1, name2, body2, ...]
    return {name: body.strip() for name, body in zip(pieces[1::2], pieces[2::2], strict=True)}


QUERIES: dict[str, str] = _load()
