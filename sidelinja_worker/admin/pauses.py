"""Pauses of job types as the admin view and the command line show and take them: which names
may be paused, and who paused one, in words a reader knows."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import asyncpg

from sidelinja_worker.admin import store
from sidelinja_worker.jobs.catalog import REGISTRY

# An action taken in the admin view is written as this prefix and the token's id: the id stays
# true when the token's label changes or its row goes (`author_token` reads it back).
ACTOR_PREFIX = "admin token "


async def pausable(pool: asyncpg.Pool, job_type: str, timeout_s: float | None = None) -> bool:
    """Whether `job_type` may be paused: a job type this installation registers, or one that
    jobs in job_queue have, which a plain-SQL writer may have enqueued under a type no worker
    here runs yet. Any other name is a typo: its pause would hold nothing and read as if it
    held the type meant. A resume takes any paused name (SQL may pause any)."""
    return job_type in REGISTRY or await store.job_type_queued(pool, job_type, timeout_s)


def author_token(text: str | None) -> UUID | None:
    """The token a pause's `paused_by` names, or None for any other text (a pause written by
    the command line or by SQL names whoever its writer says)."""
    if not text or not text.startswith(ACTOR_PREFIX):
        return None
    try:
        return UUID(text.removeprefix(ACTOR_PREFIX))
    except ValueError:
        return None


async def name_authors(
    pool: asyncpg.Pool, pauses: list[dict[str, Any]], timeout_s: float | None = None
) -> None:
    """Sets each pause's `by`: the label of the admin token that made it (its paused_by names
    the token's id, which tells a reader nothing), or paused_by as written when it names no
    token, or one without a label or a row any more."""
    tokens = {p["paused_by"]: author_token(p["paused_by"]) for p in pauses}
    ids = [t for t in tokens.values() if t is not None]
    labels = await store.token_labels(pool, ids, timeout_s) if ids else {}
    for p in pauses:
        token = tokens[p["paused_by"]]
        p["by"] = labels.get(token, p["paused_by"]) if token else p["paused_by"]
