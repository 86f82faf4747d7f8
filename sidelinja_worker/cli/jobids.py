"""Job ids as an operator types them: whole, the short form `jobs list` prints at a terminal
(the first 8 and last 6 hex digits, as the admin view shows them), or any start of one long
enough to name a single job. Checked before the database is opened; resolved after."""

from __future__ import annotations

import re
from dataclasses import dataclass
from uuid import UUID

import asyncpg

from sidelinja_worker.queue.errors import UserError
from sidelinja_worker.queue.escapes import printable

MIN_PREFIX = 4  # hex digits of an id's start; fewer would name nearly every job
HELP = (
    f"the job's id: whole, its first {MIN_PREFIX} or more hex digits, or the short form "
    "`jobs list` prints at a terminal (first 8 and last 6 digits); one that names no job or "
    "more than one is refused"
)
# Its start and its end around an ellipsis, "…" as printed or "..." as typed.
_SHORT = re.compile(r"([0-9a-f-]+)(?:…|\.\.\.)([0-9a-f-]+)")
# The ids a start and an end name, in index order: two tell an ambiguous one, a third says
# there are more. The range makes it an index scan however many jobs there are.
_RESOLVE = """
SELECT id FROM job_queue
WHERE id BETWEEN $1 AND $2 AND right(replace(id::text, '-', ''), length($3)) = $3
ORDER BY id LIMIT 3
"""


@dataclass(frozen=True, slots=True)
class JobRef:
    text: str  # as given
    whole: UUID | None  # the id, when given whole
    start: str = ""  # hex digits the id starts with
    end: str = ""  # hex digits it ends with


def parse(text: str) -> JobRef:
    """`text` as a whole id, a start, or a start and an end; a UserError if it is none."""
    given = text.strip().lower()
    try:
        return JobRef(text, UUID(given))
    except ValueError:
        pass
    short = _SHORT.fullmatch(given)
    start, end = (short[1], short[2]) if short else (given, "")
    start, end = start.replace("-", ""), end.replace("-", "")
    if (
        not re.fullmatch(f"[0-9a-f]{{{MIN_PREFIX},31}}", start)
        or not re.fullmatch("[0-9a-f]*", end)
        or len(start) + len(end) > 32
    ):
        raise UserError(
            f"job id {printable(repr(text))} is not one: give it whole, its first {MIN_PREFIX} "
            "or more hex digits, or the short form `jobs list` prints"
        )
    return JobRef(text, None, start, end)


async def resolve(pool: asyncpg.Pool, ref: JobRef) -> UUID:
    """The one job `ref` names; a UserError when it names none or several."""
    if ref.whole is not None:
        return ref.whole
    low, high = (UUID(ref.start.ljust(32, c)) for c in "0f")
    ids = [r["id"] for r in await pool.fetch(_RESOLVE, low, high, ref.end)]
    shown = printable(ref.text)
    if not ids:
        raise UserError(f"no job {shown}")
    if len(ids) > 1:
        more = ", …" if len(ids) > 2 else ""
        raise UserError(
            f"job id {shown} is ambiguous: {ids[0]}, {ids[1]}{more}; give more of its digits"
        )
    job_id: UUID = ids[0]
    return job_id
