"""Notifications are hints, never commands: a login role with no rights at all may NOTIFY any
channel the workers listen on, with any payload, and no job changes state because of it."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit
from uuid import UUID, uuid4

import asyncpg

from sidelinja_worker.queue import store
from sidelinja_worker.queue.context import JobContext
from sidelinja_worker.queue.listener import CANCEL_CHANNEL, DUE_CHANNEL, LIMITS_CHANNEL
from sidelinja_worker.queue.registry import Registry
from sidelinja_worker.queue.settings import WorkerSettings
from sidelinja_worker.queue.worker import Worker
from tests.helpers import job_type, wait_for

EVENTS_CHANNEL = "sidelinja_job_events"


async def test_notifications_from_a_role_with_no_rights_change_no_job(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    role = f"nobody_{uuid4().hex[:10]}"
    await pool.execute(f'CREATE ROLE "{role}" LOGIN')
    release = asyncio.Event()
    started: list[UUID] = []

    async def long(ctx: JobContext, payload: Any) -> dict[str, str]:
        started.append(ctx.job_id)
        await release.wait()
        return {"done": "yes"}

    running = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload) VALUES ($1, 'long', '{}')"
        " RETURNING id",
        workspace,
    )
    later = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload, scheduled_for)"
        " VALUES ($1, 'long', '{}', now() + interval '1 hour') RETURNING id",
        workspace,
    )
    worker = Worker(
        pool,
        db_url,
        Registry([job_type("long", long)]),
        WorkerSettings(poll_interval_s=0.05, max_concurrent=2, burst=True),
    )
    seen: list[UUID] = []
    hint = worker._on_cancel_notice

    def counting(job_id: UUID) -> None:
        seen.append(job_id)
        hint(job_id)

    worker._on_cancel_notice = counting  # type: ignore[method-assign]
    task = asyncio.create_task(worker.run())
    evil = None
    try:
        await wait_for(lambda: started)
        limits_before = worker._limits.current
        user = urlsplit(db_url)._replace(netloc=f"{role}@{urlsplit(db_url).netloc.split('@')[-1]}")
        evil = await asyncpg.connect(user.geturl())

        async def heard() -> bool:
            # The listener starts beside the first claim: a job can run before its LISTEN is
            # up, and a notification sent before then is gone. Hints are repeated until one lands.
            await evil.execute("SELECT pg_notify($1, $2)", CANCEL_CHANNEL, str(running))
            return running in seen

        await wait_for(heard)
        seen.clear()
        payloads = [
            str(running),
            str(later),
            str(uuid4()),
            "",
            "not a uuid",
            "x" * 7000,
            f'{{"id": "{running}", "status": "cancelled"}}',
        ]
        for channel in (CANCEL_CHANNEL, DUE_CHANNEL, LIMITS_CHANNEL, EVENTS_CHANNEL):
            for body in payloads:
                await evil.execute("SELECT pg_notify($1, $2)", channel, body)
        # The worker has taken the hint for its running job, and looked at its row.
        await wait_for(lambda: running in seen and not worker._cancel_checks)
        assert worker._limits.current == limits_before
        release.set()
        await asyncio.wait_for(task, 20)
    finally:
        release.set()
        if evil is not None:
            await evil.close()
        await pool.execute(f'DROP ROLE "{role}"')
    a = await store.get_job(pool, running)
    b = await store.get_job(pool, later)
    assert a is not None and b is not None
    assert (a["status"], a["cancel_requested_at"]) == ("completed", None)
    assert (b["status"], b["attempts"]) == ("pending", 0)
