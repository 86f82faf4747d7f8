"""Loads a package's named-block SQL file into statements, once, at import."""

from __future__ import annotations

import re
from importlib import resources

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
_INCLUDE = re.compile(r"^-- include: (\w+)\s*$", re.MULTILINE)


def load(package: str, file_name: str = "queries.sql") -> dict[str, str]:
    """The `-- name: x` blocks of `file_name` inside `package`, by name. Each layer and each job
    domain keeps its SQL beside its code: `load(__package__)` in its store module."""
    return parse(resources.files(package).joinpath(file_name).read_text("utf-8"))


def parse(text: str) -> dict[str, str]:
    """The `-- name: x` blocks of `text`, by name. A block named `_x` is a fragment, not a
    statement: a line `-- include: _x` in another block stands for it (the claims share their
    SET and RETURNING lists so, which must hold the same for every claim algorithm)."""
    pieces = _NAME.split(text)
    # pieces = [preamble, name1, body1, name2, body2, ...]
    blocks = {name: body.strip() for name, body in zip(pieces[1::2], pieces[2::2], strict=True)}
    return {
        name: _INCLUDE.sub(lambda m: blocks[m[1]], body)
        for name, body in blocks.items()
        if not name.startswith("_")
    }


QUERIES: dict[str, str] = load("sidelinja_worker.queue", "sql/queries.sql")
