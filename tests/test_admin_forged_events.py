"""Notifications are hints: a login role with no rights on any table sends crafted payloads on
the admin's events channel, and no live stream shows anything from them. Each stream reads the
named jobs again under its token's scope and sends only what the rows confirm."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import orjson
import pytest

from sidelinja_worker.admin.events import CHANNEL, EventHub
from sidelinja_worker.admin.store import Scope
from tests.helpers import make_workspace
from tests.test_rls import RoleMaker, connected, make_role_fixture  # noqa: F401 (fixture)


async def one_job(pool: asyncpg.Pool, workspace: UUID) -> UUID:
    return await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload) VALUES ($1, 'noop', '{}')"
        " RETURNING id",
        workspace,
    )


async def data_frame(stream: AsyncIterator[bytes]) -> dict[str, Any]:
    """The stream's next event, skipping the greeting and keepalives."""
    async with asyncio.timeout(10):
        while True:
            frame = await anext(stream)
            if frame.startswith(b"data: "):
                return dict(orjson.loads(frame[6:]))


@contextlib.asynccontextmanager
async def forwarded_to_spacetime(
    db_url: str, pool: asyncpg.Pool, role: str, calls: list[Any]
) -> AsyncIterator[asyncpg.Connection]:
    """The admin's event hub forwarding to a fake SpacetimeDB that records each call in
    `calls`, and a connection as `role` to send notifications from."""
    from sidelinja_worker.admin.app import forwarding
    from sidelinja_worker.admin.spacetime import SpacetimeTarget
    from sidelinja_worker.queue.config import Secret
    from tests.fakes.serve import serve
    from tests.test_admin_spacetime import fake_spacetime

    hub = EventHub(db_url, pool)
    await hub.start()
    try:
        async with serve(fake_spacetime(calls, fail_first=False)) as url:
            target = SpacetimeTarget(url, "sidelinja", "job_event", Secret("stdb-token"))
            async with forwarding(hub, target), connected(db_url, role) as conn:
                yield conn
    finally:
        await hub.stop()


def forgeries(a: UUID, b: UUID, a_job: UUID, b_job: UUID, a_running: UUID) -> list[Any]:
    batch = {"job_type": "noop", "max_attempts": 3}
    return [
        # A's job in a state it is not in, or with attempts it has not made.
        {
            **batch,
            "workspace_id": str(a),
            "status": "completed",
            "ids": [str(a_job)],
            "attempts": [0],
        },
        {
            **batch,
            "workspace_id": str(a),
            "status": "pending",
            "ids": [str(a_job)],
            "attempts": [7],
        },
        # B's job, claimed to be A's (A's stream must not learn it exists, let alone its state).
        {
            **batch,
            "workspace_id": str(a),
            "status": "pending",
            "ids": [str(b_job)],
            "attempts": [0],
        },
        {**batch, "workspace_id": str(a), "status": "error", "ids": [str(b_job)], "attempts": [3]},
        # Jobs that do not exist, many at once.
        {
            **batch,
            "workspace_id": str(a),
            "status": "pending",
            "ids": [str(uuid4()) for _ in range(150)],
            "attempts": [0] * 150,
        },
        # Progress that the job never reported.
        {
            "id": str(a_running),
            "workspace_id": str(a),
            "job_type": "noop",
            "status": "running",
            "progress": {"message": "Betal her: https://evil.example", "percent": 99},
        },
        {"id": str(a_running), "workspace_id": str(a), "status": "running"},  # no attempts
        # Malformed shapes.
        {"id": "not-a-uuid", "workspace_id": str(a), "status": "pending"},
        {"id": None, "workspace_id": None, "status": None},
        {"workspace_id": str(a), "ids": [str(a_job)], "attempts": []},
        {"workspace_id": str(a), "ids": str(a_job), "attempts": 0},
        [str(a_job)],
        "pending",
        None,
    ]


async def test_forged_notifications_show_nothing_on_any_stream(
    pool: asyncpg.Pool, db_url: str, make_role: RoleMaker
) -> None:
    a = await make_workspace(pool, "A")
    b = await make_workspace(pool, "B")
    a_job = await one_job(pool, a)
    b_job = await one_job(pool, b)
    a_running = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload, status, attempts, progress)"
        " VALUES ($1, 'noop', '{}', 'running', 1, '{\"message\": \"real\"}') RETURNING id",
        a,
    )
    before = await pool.fetch("SELECT * FROM job_queue ORDER BY id")
    attacker = await make_role()  # LOGIN, and no rights on any table
    hub = EventHub(db_url, pool)
    await hub.start()
    streams = {
        name: hub.stream(Scope(None, ws)) for name, ws in (("a", a), ("b", b), ("all", None))
    }
    try:
        for s in streams.values():
            assert b"connected" in await anext(s)
        async with connected(db_url, attacker) as conn:
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.fetch("SELECT id FROM job_queue")
            for forged in forgeries(a, b, a_job, b_job, a_running):
                await conn.execute(
                    "SELECT pg_notify($1, $2)", CHANNEL, orjson.dumps(forged).decode()
                )
            for raw in ("not json", "", "{", '{"ids": [1], "attempts": [1]}', "\x7f" * 7000):
                await conn.execute("SELECT pg_notify($1, $2)", CHANNEL, raw)
        # Real changes after the forgeries: each stream's first event must be a real one.
        a_new = await one_job(pool, a)
        b_new = await one_job(pool, b)
        first = {name: await data_frame(s) for name, s in streams.items()}
    finally:
        for s in streams.values():
            await s.aclose()
        await hub.stop()
    assert first["a"]["id"] == str(a_new) and first["a"]["status"] == "pending"
    assert first["b"]["id"] == str(b_new)
    assert first["all"]["id"] == str(a_new)
    after = await pool.fetch(
        "SELECT * FROM job_queue WHERE id <> ALL($1) ORDER BY id", [a_new, b_new]
    )
    assert after == before  # and no job changed state


async def test_a_real_progress_report_is_confirmed_and_sent(
    pool: asyncpg.Pool, db_url: str
) -> None:
    """The confirmation lets the genuine event through: the stream sends the row's progress."""
    from sidelinja_worker.queue import store

    a = await make_workspace(pool, "A")
    job = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload, status, worker_id, attempts)"
        " VALUES ($1, 'noop', '{}', 'running', $1, 1) RETURNING id",
        a,
    )
    hub = EventHub(db_url, pool)
    await hub.start()
    stream = hub.stream(Scope(None, a))
    try:
        assert b"connected" in await anext(stream)
        await store.report_progress(pool, job, a, "Transkriberer…", 40)
        event = await data_frame(stream)
    finally:
        await stream.aclose()
        await hub.stop()
    assert event["id"] == str(job) and event["progress"]["message"] == "Transkriberer…"
    assert (event["status"], event["attempts"]) == ("running", 1)


async def test_forged_notifications_are_not_forwarded_to_spacetimedb(
    pool: asyncpg.Pool, db_url: str, make_role: RoleMaker
) -> None:
    """The forwarder passes on only what the database confirms, so the platform's own live
    pages (fed by SpacetimeDB) cannot be fed forgeries either; a batch naming real and forged
    jobs is passed on with the real ones alone."""

    a = await make_workspace(pool, "A")
    b = await make_workspace(pool, "B")
    a_job, b_job = await one_job(pool, a), await one_job(pool, b)
    a_running = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload, status, attempts)"
        " VALUES ($1, 'noop', '{}', 'running', 1) RETURNING id",
        a,
    )
    calls: list[Any] = []
    async with forwarded_to_spacetime(db_url, pool, await make_role(), calls) as conn:
        mixed = {
            "workspace_id": str(a),
            "job_type": "noop",
            "status": "pending",
            "max_attempts": 3,
            "ids": [str(uuid4()), str(a_job), str(b_job)],
            "attempts": [0, 0, 0],
        }
        for forged in [*forgeries(a, b, a_job, b_job, a_running), mixed]:
            await conn.execute("SELECT pg_notify($1, $2)", CHANNEL, orjson.dumps(forged).decode())
        a_new = await one_job(pool, a)
        async with asyncio.timeout(10):
            while len(calls) < 2:
                await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # anything forwarded late would show up here
    sent = [orjson.loads(c[2][0]) for c in calls]
    assert [(p["ids"], p["attempts"]) for p in sent] == [([str(a_job)], [0]), ([str(a_new)], [0])]


async def test_a_confirmed_notification_is_forwarded_with_the_row_s_values_alone(
    pool: asyncpg.Pool, db_url: str, make_role: RoleMaker
) -> None:
    """Any role hears every workspace's events, and may send one back with fields of its own:
    the claims the database checks hold, so it is confirmed, but what reaches SpacetimeDB (and
    the pages it feeds) is built from the rows, never the forger's extra fields."""

    b = await make_workspace(pool, "B")
    progress = {"message": "Transkriberer", "percent": 10}
    b_job, b_running = await pool.fetchval(
        "WITH j AS (INSERT INTO job_queue (workspace_id, job_type, payload, status, attempts,"
        "                                  progress)"
        " VALUES ($1, 'noop', '{}', 'pending', 0, NULL), ($1, 'noop', '{}', 'running', 1, $2)"
        " RETURNING id, status) SELECT array_agg(id ORDER BY status) FROM j",
        b,
        progress,
    )
    extra = {"message": "Betal her: https://evil.example", "html": "<img src=x onerror=alert(1)>"}
    forged = [
        {
            "workspace_id": str(b),
            "job_type": "noop",
            "status": "pending",
            "max_attempts": 3,
            "ids": [str(b_job)],
            "attempts": [0],
            **extra,
        },
        {
            "id": str(b_running),
            "workspace_id": str(b),
            "job_type": "noop",
            "status": "running",
            "progress": progress,
            **extra,
        },
    ]
    calls: list[Any] = []
    async with forwarded_to_spacetime(db_url, pool, await make_role(), calls) as conn:
        for payload in forged:
            await conn.execute("SELECT pg_notify($1, $2)", CHANNEL, orjson.dumps(payload).decode())
        last = await one_job(pool, b)  # forwarded after them, in order
        async with asyncio.timeout(10):
            while str(last) not in str(calls):
                await asyncio.sleep(0.05)
    sent = [orjson.loads(c[2][0]) for c in calls]
    assert [p.get("ids", p.get("id")) for p in sent] == [[str(b_job)], str(b_running), [str(last)]]
    assert not [p for p in sent if p.keys() & extra.keys()], sent
    assert sent[1]["progress"] == progress
