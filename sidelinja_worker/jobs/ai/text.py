"""Pure text helpers for the AI jobs: the context budget, splitting long inputs without losing a
character, grouping partial answers for the combine step."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

# No tokenizer for every model behind the gateway, so estimate: Norwegian text runs about 3.5-4
# characters per token on common tokenizers; 3 errs on the side of smaller parts.
CHARS_PER_TOKEN = 3


def budget_chars(context_tokens: int) -> int:
    return max(context_tokens, 1) * CHARS_PER_TOKEN


def split_text(text: str, max_chars: int) -> list[str]:
    """Parts of at most `max_chars`, cut at line ends where possible, else at a space; the
    parts joined give back `text` exactly (a split, never a cut)."""
    if len(text) <= max_chars:
        return [text]
    parts: list[str] = []
    current: list[str] = []
    size = 0
    for piece in _pieces(text, max_chars):
        if current and size + len(piece) > max_chars:
            parts.append("".join(current))
            current, size = [], 0
        current.append(piece)
        size += len(piece)
    if current:
        parts.append("".join(current))
    return parts


def _pieces(text: str, max_chars: int) -> Iterator[str]:
    """Lines, with a line longer than `max_chars` broken after a space (or hard, if none).
    A long line is cut by position, never re-sliced: linear in its length."""
    for line in text.splitlines(keepends=True):
        start, end = 0, len(line)
        while end - start > max_chars:
            cut = line.rfind(" ", start, start + max_chars)
            cut = cut + 1 if cut > start else start + max_chars
            yield line[start:cut]
            start = cut
        if start < end:
            yield line[start:]


def group_for_combine(items: Sequence[str], max_chars: int) -> list[list[str]]:
    """Consecutive items in groups that fit `max_chars`, but never one item alone while more
    are left: each combine round at least halves the count, so combining always ends."""
    groups: list[list[str]] = []
    current: list[str] = []
    size = 0
    for item in items:
        if len(current) >= 2 and size + len(item) > max_chars:
            groups.append(current)
            current, size = [], 0
        current.append(item)
        size += len(item)
    if len(current) == 1 and groups:
        groups[-1].append(current[0])
    elif current:
        groups.append(current)
    return groups
