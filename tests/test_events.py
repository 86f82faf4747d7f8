"""Status events never break a write: no job_type and no batch size makes the event trigger exceed
NOTIFY's payload limit, and a listener that stops reading cannot make job writes fail by filling
PostgreSQL's notification queue. By default they are sent only while a listener holds a lease."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import orjson

from sidelinja_worker.queue import migrate
from tests.helpers import insert_jobs, make_workspace, running_worker, wait_for_sql

CHANNEL = "sidelinja_job_events"


class Listener:
    """A connection LISTENing on the events channel, collecting every payload; registered with a
    listener lease unless told not to (events are sent only while some lease is live)."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.events: list[dict[str, Any]] = []
        self.lease = uuid4()

    @classmethod
    async def open(cls, url: str, register: bool = True) -> Listener:
        listener = cls(await asyncpg.connect(url))
        await listener.conn.add_listener(
            CHANNEL, lambda *a: listener.events.append(orjson.loads(a[3]))
        )
        if register:
            await listener.conn.execute(
                "SELECT sidelinja_job_events_listen($1, 'test', 60)", listener.lease
            )
        return listener

    async def settle(self) -> None:
        """Every notification committed before this call has been delivered after it."""
        await self.conn.execute("SELECT 1")

    def ids(self, match: Callable[[dict[str, Any]], bool] = lambda e: True) -> list[str]:
        return [i for e in self.events if match(e) for i in e.get("ids", [])]

    async def wait_for(self, done: Callable[[], bool], timeout_s: float = 30) -> None:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while not done():
            assert asyncio.get_running_loop().time() < deadline, self.events[-3:]
            await asyncio.sleep(0.02)

    async def close(self) -> None:
        await self.conn.execute("SELECT sidelinja_job_events_unlisten($1)", self.lease)
        await self.conn.close()


async def test_a_huge_job_type_degrades_the_event_not_the_write(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    listener = await Listener.open(db_url)
    try:
        job_type = "x" * 10_000
        job_id = await pool.fetchval(
            "INSERT INTO job_queue (workspace_id, job_type, payload) VALUES ($1, $2, '{}')"
            " RETURNING id",
            workspace,
            job_type,
        )
        await pool.execute("UPDATE job_queue SET status = 'cancelled' WHERE id = $1", job_id)
        await listener.wait_for(lambda: len(listener.ids()) >= 2)
        pending, cancelled = listener.events
        assert (pending["status"], cancelled["status"]) == ("pending", "cancelled")
        assert pending["ids"] == cancelled["ids"] == [str(job_id)]
        assert pending["job_type"] is None  # too long to send: the event names its job
        assert pending["workspace_id"] == str(workspace)
    finally:
        await listener.close()


async def test_a_job_type_just_under_the_cap_is_sent_whole(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """150 jobs with the longest job_type still sent, in ids and attempts as long as they get."""
    listener = await Listener.open(db_url)
    try:
        job_type = "é" * 255  # 510 bytes of JSON
        await pool.execute(
            "INSERT INTO job_queue (workspace_id, job_type, payload, max_attempts, attempts)"
            " SELECT $1, $2, '{}', -32768, -32768 FROM generate_series(1, 150)",
            workspace,
            job_type,
        )
        await listener.wait_for(lambda: len(listener.ids()) >= 150)
        assert [e["job_type"] for e in listener.events] == [job_type]
    finally:
        await listener.close()


async def test_a_50000_row_insert_is_published_in_many_notifications(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    other = await make_workspace(pool, "other")
    listener = await Listener.open(db_url)
    try:
        await pool.execute(
            "INSERT INTO job_queue (workspace_id, job_type, payload)"
            " SELECT CASE WHEN i % 2 = 0 THEN $1::uuid ELSE $2::uuid END,"
            " CASE WHEN i % 3 = 0 THEN repeat(chr(1), 1000) ELSE 'noop' END, '{}'"
            " FROM generate_series(1, 50000) AS i",
            workspace,
            other,
        )
        await listener.wait_for(lambda: len(listener.ids()) >= 50_000, timeout_s=60)
        assert len(set(listener.ids())) == 50_000
        assert {e["job_type"] for e in listener.events} == {"noop", None}
    finally:
        await listener.close()


async def queue_state(pool: asyncpg.Pool) -> asyncpg.Record:
    return await pool.fetchrow("SELECT * FROM sidelinja_notify_queue_state()")


async def test_a_listener_that_stops_reading_cannot_fill_the_queue(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """A session that LISTENs and then sits in an open transaction holds the queue's tail. With
    the threshold at its smallest, events stop as soon as the queue holds a page: the writes go
    on, the state function reports the pause, and events resume once the threshold allows."""
    await pool.execute(
        "UPDATE queue_settings SET value = '0.000000001' WHERE name = 'job_events_max_queue_usage'"
    )
    stuck = await asyncpg.connect(db_url)
    await stuck.execute(f"LISTEN {CHANNEL}")
    await stuck.execute("SELECT sidelinja_job_events_listen($1, 'stuck', 60)", uuid4())
    await stuck.execute("BEGIN")  # notifications are never delivered inside a transaction
    try:
        # The queue is the cluster's: another database's listener may already hold a page, in
        # which case events are paused from the start; either way they must end up paused.
        for _ in range(2000):  # each event is ~200 bytes; a page is 8 kB
            await pool.execute(
                "INSERT INTO job_queue (workspace_id, job_type, payload)"
                " VALUES ($1, repeat('y', 500), '{}')",
                workspace,
            )
            if (await queue_state(pool))["events_paused"]:
                break
        state = await queue_state(pool)
        assert state["events_paused"] and not state["wakeups_paused"], state
        assert 0 < state["usage"] < 0.5
        # Paused: another 500 writes succeed and add only their wake-ups to the queue.
        await pool.execute(
            "INSERT INTO job_queue (workspace_id, job_type, payload)"
            " SELECT $1, 'noop', '{}' FROM generate_series(1, 500)",
            workspace,
        )

        listener = await Listener.open(db_url)
        try:
            await pool.execute(
                "UPDATE queue_settings SET value = '0.5' WHERE name = 'job_events_max_queue_usage'"
            )
            job_id = await pool.fetchval(
                "INSERT INTO job_queue (workspace_id, job_type, payload)"
                " VALUES ($1, 'after', '{}') RETURNING id",
                workspace,
            )
            await listener.wait_for(lambda: str(job_id) in listener.ids())
            assert [e["job_type"] for e in listener.events] == ["after"]  # none while paused
        finally:
            await listener.close()
    finally:
        await stuck.close()


async def test_a_bad_threshold_reads_as_the_default(pool: asyncpg.Pool) -> None:
    for value in ('"half"', "2", "-1", "1e400", "null"):
        await pool.execute(
            "UPDATE queue_settings SET value = $1::jsonb WHERE name = 'job_events_max_queue_usage'",
            value,
        )
        assert await pool.fetchval("SELECT sidelinja_job_events_max_usage()") == 0.5
        await pool.execute(
            "INSERT INTO job_queue (workspace_id, job_type, payload)"
            " SELECT id, 'noop', '{}' FROM workspaces LIMIT 1"
        )


async def test_a_threshold_no_float_holds_never_fails_a_write(
    pool: asyncpg.Pool, workspace: UUID
) -> None:
    """A number in [0, 1] that a float8 cannot hold (1e-400 underflows) failed the trigger on
    every INSERT and UPDATE of job_queue: the web app's enqueues, every claim and completion.
    It reads as 0 (events paused), the smallest threshold there is."""
    await pool.execute(
        "UPDATE queue_settings SET value = '1e-400' WHERE name = 'job_events_max_queue_usage'"
    )
    assert await pool.fetchval("SELECT sidelinja_job_events_max_usage()") == 0.0
    state = await pool.fetchrow("SELECT * FROM sidelinja_notify_queue_state()")
    assert state["events_paused"]
    job_id = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload) VALUES ($1, 'noop', '{}')"
        " RETURNING id",
        workspace,
    )
    await pool.execute("UPDATE job_queue SET status = 'completed' WHERE id = $1", job_id)


async def test_in_auto_mode_events_are_sent_only_while_a_listener_is_registered(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    await pool.execute("UPDATE queue_settings SET value = '\"auto\"' WHERE name = 'job_events'")
    listener = await Listener.open(db_url, register=False)
    me = UUID(int=7)

    async def insert(job_type: str) -> str:
        return str(
            await pool.fetchval(
                "INSERT INTO job_queue (workspace_id, job_type, payload) VALUES ($1, $2, '{}')"
                " RETURNING id",
                workspace,
                job_type,
            )
        )

    try:
        await insert("unregistered")  # LISTENing, but not registered: nothing is sent
        await pool.execute("SELECT sidelinja_job_events_listen($1, 'test', 60)", me)
        registered = await insert("registered")
        await listener.wait_for(lambda: registered in listener.ids())
        await pool.execute("SELECT sidelinja_job_events_unlisten($1)", me)
        await insert("unregistered again")
        # A lease that runs out ends the events as an unlisten does.
        await pool.execute("SELECT sidelinja_job_events_listen($1, 'test', 1)", me)
        leased = await insert("leased")
        await listener.wait_for(lambda: leased in listener.ids())
        await pool.execute("UPDATE job_event_listeners SET expires_at = now() - interval '1 s'")
        await insert("expired")
        await pool.execute("UPDATE queue_settings SET value = 'true' WHERE name = 'job_events'")
        always = await insert("always")  # true: sent with no listener registered
        await listener.wait_for(lambda: always in listener.ids())
        assert [e["job_type"] for e in listener.events] == ["registered", "leased", "always"]
    finally:
        await listener.close()


async def test_a_role_that_only_inserts_jobs_still_publishes(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """The trigger reads its settings as its owner: the web app's role needs no rights on them."""
    await pool.execute("UPDATE queue_settings SET value = '\"auto\"' WHERE name = 'job_events'")
    await pool.execute("SELECT sidelinja_job_events_listen($1, 'test', 60)", UUID(int=8))
    listener = await Listener.open(db_url, register=False)
    try:
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute("REVOKE SELECT ON queue_settings FROM sidelinja_app")
            await conn.execute("SET LOCAL ROLE sidelinja_app")
            await conn.execute(
                "SELECT set_config('sidelinja.workspace_id', $1::text, true)", str(workspace)
            )
            job_id = await conn.fetchval(
                "INSERT INTO job_queue (workspace_id, job_type, payload)"
                " VALUES ($1, 'as_app', '{}') RETURNING id",
                workspace,
            )
        await listener.wait_for(lambda: str(job_id) in listener.ids())
    finally:
        await listener.close()


async def test_by_default_a_drain_no_one_listens_to_sends_no_status_event(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """The default mode is auto: with no lease, neither the inserts nor the worker's claims and
    completions notify the events channel; a lease brings the events back."""
    assert await pool.fetchval(
        "SELECT value::text FROM queue_settings WHERE name = 'job_events'"
    ) == ('"auto"')
    listener = await Listener.open(db_url, register=False)
    try:
        await insert_jobs(pool, workspace, 200)
        async with running_worker(pool, db_url, max_concurrent=50):
            await wait_for_sql(
                pool, "SELECT count(*) = 200 FROM job_queue WHERE status = 'completed'"
            )
        await listener.settle()
        assert listener.events == []

        await pool.execute("SELECT sidelinja_job_events_listen($1, 'test', 60)", listener.lease)
        await insert_jobs(pool, workspace, 1)
        await listener.wait_for(lambda: len(listener.ids()) == 1)
        assert [e["status"] for e in listener.events] == ["pending"]
    finally:
        await listener.close()


async def test_the_upgrade_to_auto_keeps_an_operators_choice(pool: asyncpg.Pool) -> None:
    """Migration 0029 switches `job_events` to auto only where it still holds the default the
    installation wrote (true, untouched since migration 0009); run again here over each state."""

    async def upgrade_from(value: str | None, stamped: bool) -> str | None:
        await pool.execute("DELETE FROM queue_settings WHERE name = 'job_events'")
        if value is not None:
            await pool.execute(
                "INSERT INTO queue_settings (name, value, updated_at)"
                " SELECT 'job_events', $1::text::jsonb, CASE WHEN $2 THEN now() ELSE applied_at END"
                " FROM sidelinja_schema_migrations WHERE version = 9",
                value,
                stamped,
            )
        await pool.execute("DELETE FROM sidelinja_schema_migrations WHERE version = 29")
        async with pool.acquire() as conn:
            assert [m.version for m in await migrate.apply_all(conn)] == [29]
        return await pool.fetchval(
            "SELECT value::text FROM queue_settings WHERE name = 'job_events'"
        )

    assert await upgrade_from("true", stamped=False) == '"auto"'  # the untouched default
    assert await upgrade_from("true", stamped=True) == "true"  # set by an operator since
    assert await upgrade_from("false", stamped=False) == "false"
    assert await upgrade_from(None, stamped=False) == '"auto"'
