"""Status events from PostgreSQL on `sidelinja_job_events`: the documented payload, batched per
statement, workspace, type and change; and the app's fan-out per token scope."""

from __future__ import annotations

import asyncio
from typing import Any, cast
from uuid import UUID, uuid4

import asyncpg
import orjson
import pytest

from sidelinja_worker.admin import events as events_module
from sidelinja_worker.admin.events import CHANNEL, EventHub, confirmed, explode
from sidelinja_worker.admin.store import TEXT_SHOWN, Scope
from sidelinja_worker.queue.context import JobContext, Services
from sidelinja_worker.queue.db import connect
from tests.helpers import insert_jobs, make_workspace, wait_for_sql
from tests.test_admin_forged_events import data_frame


async def collect(url: str, action: Any, settle_s: float = 0.3) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []
    conn = await connect(url)
    await conn.add_listener(CHANNEL, lambda *a: got.append(orjson.loads(a[3])))
    lease = uuid4()  # status events are sent only while a listener holds a lease
    await conn.execute("SELECT sidelinja_job_events_listen($1, 'test', 60)", lease)
    try:
        await action()
        await asyncio.sleep(settle_s)  # notifications are delivered after commit, asynchronously
    finally:
        await conn.execute("SELECT sidelinja_job_events_unlisten($1)", lease)
        await conn.close()
    return got


async def test_inserts_and_status_changes_are_published_in_batches(
    pool: asyncpg.Pool, db_url: str
) -> None:
    a = await make_workspace(pool, "A")
    b = await make_workspace(pool, "B")

    async def enqueue() -> None:
        await insert_jobs(pool, a, 3)
        await insert_jobs(pool, b, 1)

    inserted = await collect(db_url, enqueue)
    assert sorted((p["workspace_id"], len(p["ids"])) for p in inserted) == sorted(
        [(str(a), 3), (str(b), 1)]
    )
    assert all(p["status"] == "pending" for p in inserted)

    changed = await collect(
        db_url, lambda: pool.execute("UPDATE job_queue SET status = 'error', attempts = 3")
    )
    assert len(changed) == 2
    one = next(p for p in changed if p["workspace_id"] == str(a))
    assert set(one) == {"workspace_id", "job_type", "status", "max_attempts", "ids", "attempts"}
    assert (one["job_type"], one["status"], one["max_attempts"], one["attempts"]) == (
        "noop",
        "error",
        3,
        [3, 3, 3],
    )


async def test_a_big_statement_is_split_under_the_notify_limit(
    pool: asyncpg.Pool, db_url: str
) -> None:
    a = await make_workspace(pool, "A")
    got = await collect(db_url, lambda: insert_jobs(pool, a, 1000))
    assert sum(len(p["ids"]) for p in got) == 1000
    assert len({i for p in got for i in p["ids"]}) == 1000  # each job once
    assert all(len(p["ids"]) == len(p["attempts"]) <= 150 for p in got)
    assert max(len(orjson.dumps(p)) for p in got) < 8000


async def test_a_job_type_needing_escapes_comes_through_intact(
    pool: asyncpg.Pool, db_url: str
) -> None:
    """The payload is written as text by the trigger; job_type is the one free-text field."""
    a = await make_workspace(pool, "A")
    odd = 'say "hei"\\ på\nnorsk\t{}'
    got = await collect(
        db_url,
        lambda: pool.execute(
            "INSERT INTO job_queue (workspace_id, job_type, payload) VALUES ($1, $2, '{}')", a, odd
        ),
    )
    assert [p["job_type"] for p in got] == [odd]


def test_explode_gives_one_event_per_job() -> None:
    batch = {
        "workspace_id": "w",
        "job_type": "t",
        "status": "running",
        "max_attempts": 3,
        "ids": ["1", "2"],
        "attempts": [1, 2],
    }
    events = explode(orjson.dumps(batch).decode())
    assert [(e["id"], e["attempts"], e["status"]) for e in events] == [
        ("1", 1, "running"),
        ("2", 2, "running"),
    ]
    progress = {
        "id": "1",
        "workspace_id": "w",
        "job_type": "t",
        "status": "running",
        "progress": {"message": "x"},
    }
    assert explode(orjson.dumps(progress).decode()) == [progress]


async def test_the_hub_gives_each_stream_only_its_workspace(
    pool: asyncpg.Pool, db_url: str
) -> None:
    """Every frame is the job's row as the stream's scope reads it (status, attempts)."""
    a = await make_workspace(pool, "A")
    b = await make_workspace(pool, "B")
    hub = EventHub(db_url, pool)
    await hub.start()
    streams = {
        name: hub.stream(Scope(None, ws)) for name, ws in (("a", a), ("b", b), ("all", None))
    }
    try:
        for s in streams.values():
            assert b"connected" in await anext(s)
        # B, A, B: a leak into either stream would be among the frames read below.
        await insert_jobs(pool, b, 1)
        await insert_jobs(pool, a, 2)
        await insert_jobs(pool, b, 1)
        seen = {
            name: [await asyncio.wait_for(anext(s), 5) for _ in range(n)]
            for (name, s), n in zip(streams.items(), (2, 2, 4), strict=True)
        }
    finally:
        for s in streams.values():
            await s.aclose()
        await hub.stop()
    for name, ws in (("a", a), ("b", b)):
        assert all(orjson.loads(f[6:])["workspace_id"] == str(ws) for f in seen[name])
    assert {orjson.loads(f[6:])["workspace_id"] for f in seen["all"]} == {str(a), str(b)}


async def test_progress_reports_reach_the_channel(pool: asyncpg.Pool, db_url: str) -> None:
    a = await make_workspace(pool, "A")
    job: UUID = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload, status, worker_id)"
        " VALUES ($1, 'noop', '{}', 'running', $2) RETURNING id",
        a,
        a,
    )
    from sidelinja_worker.queue import store

    got = await collect(db_url, lambda: store.report_progress(pool, job, a, "Transkriberer…", 40))
    assert got[0]["id"] == str(job) and got[0]["progress"]["message"] == "Transkriberer…"


async def test_progress_reports_of_one_job_are_stored_in_the_order_made(pool: asyncpg.Pool) -> None:
    """Concurrent parts of a job report at once (prompt_eval's cases): the last report made is
    the one stored, although each write may go out on its own pool connection."""
    a = await make_workspace(pool, "A")
    job: UUID = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload, status, worker_id)"
        " VALUES ($1, 'noop', '{}', 'running', $2) RETURNING id",
        a,
        a,
    )
    services = Services(pool, None, None, None)  # type: ignore[arg-type]  # only the pool
    ctx = JobContext(job, a, "noop", 1, 3, services, a)
    for _ in range(5):
        await asyncio.gather(*(ctx.progress(f"{i}/30", i) for i in range(1, 31)))
        stored = await pool.fetchval("SELECT progress FROM job_queue WHERE id = $1", job)
        assert stored["message"] == "30/30"


async def test_a_stream_ends_once_its_token_is_revoked(
    pool: asyncpg.Pool, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(events_module, "REVALIDATE_S", 0.05)
    hub = EventHub(db_url, pool)
    await hub.start()
    valid = [True, False]

    async def still_valid() -> bool:
        return valid.pop(0)

    try:
        async with asyncio.timeout(5):
            frames = [f async for f in hub.stream(Scope(None, None), still_valid)]
    finally:
        await hub.stop()
    assert frames == [b"retry: 2000\n: connected\n\n"] and valid == []


async def test_events_can_be_switched_off(pool: asyncpg.Pool, db_url: str) -> None:
    a = await make_workspace(pool, "A")
    await pool.execute("UPDATE queue_settings SET value = 'false' WHERE name = 'job_events'")
    assert await collect(db_url, lambda: insert_jobs(pool, a, 3)) == []
    await pool.execute("UPDATE queue_settings SET value = 'true' WHERE name = 'job_events'")
    assert len(await collect(db_url, lambda: insert_jobs(pool, a, 3))) == 1


async def test_the_hub_holds_a_listener_lease_while_it_runs(
    pool: asyncpg.Pool, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hub registers on start and renews well within its lease, so the default (auto) mode
    publishes for it; on stop it withdraws."""
    monkeypatch.setattr(events_module, "LEASE_RENEW_S", 0.05)
    live = "SELECT count(*) FROM job_event_listeners WHERE label = 'admin' AND expires_at > now()"
    assert await pool.fetchval(
        "SELECT value::text FROM queue_settings WHERE name = 'job_events'"
    ) == ('"auto"')
    hub = EventHub(db_url, pool)
    await hub.start()
    try:
        assert await pool.fetchval(live) == 1
        first = await pool.fetchval("SELECT expires_at FROM job_event_listeners")
        await wait_for_sql(pool, "SELECT expires_at > $1 FROM job_event_listeners", first)
    finally:
        await hub.stop()
    assert await pool.fetchval("SELECT count(*) FROM job_event_listeners") == 0


# Types whose JSON text is over the trigger's 512 bytes, so that their status events say
# "job_type": null, and the type each event carries: the row's, read to its first TEXT_SHOWN
# characters.
LEFT_OUT_TYPES = {
    "300 two-byte characters": ("é" * 300, "é" * 300),  # 602 bytes of JSON, 300 characters
    "511 ASCII characters": ("x" * 511, "x" * 511),  # 513 bytes of JSON
    "a megabyte": ("t" * 1_000_000, "t" * TEXT_SHOWN),
    "300,000 four-byte characters": ("\U0001f600" * 300_000, "\U0001f600" * TEXT_SHOWN),
}
# Any event of a job, its type at most TEXT_SHOWN characters of up to 4 bytes each.
EVENT_MAX_BYTES = 4096


@pytest.mark.parametrize(("job_type", "shown"), LEFT_OUT_TYPES.values(), ids=LEFT_OUT_TYPES)
async def test_a_job_whose_type_the_trigger_leaves_out_is_streamed_and_forwarded(
    pool: asyncpg.Pool, db_url: str, job_type: str, shown: str
) -> None:
    """The trigger leaves out a type whose JSON is over 512 bytes ("job_type": null) and still
    names the jobs; the hub compared that null with the row's type, so no status change of such
    a job reached a page or SpacetimeDB. Each now arrives with the row's type, bounded."""
    a = await make_workspace(pool, "A")
    hub = EventHub(db_url, pool)
    forwarded: asyncio.Queue[str] = asyncio.Queue()
    hub.payload_listeners.append(forwarded.put_nowait)
    await hub.start()
    stream = hub.stream(Scope(None, a))
    frames: list[dict[str, Any]] = []
    payloads: list[str] = []
    try:
        assert b"connected" in await anext(stream)
        job = await pool.fetchval(
            "INSERT INTO job_queue (workspace_id, job_type, payload) VALUES ($1, $2, '{}')"
            " RETURNING id",
            a,
            job_type,
        )
        for change in ("status = 'running', attempts = 1", "status = 'completed'"):
            # Both confirm against the row as it is then: the next change waits for them.
            frames.append(await data_frame(stream))
            payloads.append(await asyncio.wait_for(forwarded.get(), 10))
            await pool.execute(f"UPDATE job_queue SET {change} WHERE id = $1", job)
        frames.append(await data_frame(stream))
        payloads.append(await asyncio.wait_for(forwarded.get(), 10))
    finally:
        await stream.aclose()
        await hub.stop()
    steps = [("pending", 0), ("running", 1), ("completed", 1)]
    assert [(f["id"], f["status"], f["attempts"]) for f in frames] == [
        (str(job), *s) for s in steps
    ]
    assert all(f["job_type"] == shown for f in frames)
    sent = [orjson.loads(p) for p in payloads]
    assert [(p["ids"], p["status"], p["attempts"]) for p in sent] == [
        ([str(job)], s, [n]) for s, n in steps
    ]
    assert all(p["job_type"] == shown for p in sent)
    assert max(len(orjson.dumps(f)) for f in frames) < EVENT_MAX_BYTES
    assert max(len(p.encode()) for p in payloads) < EVENT_MAX_BYTES


@pytest.mark.parametrize("length", [TEXT_SHOWN + 100, 10_000])
async def test_a_progress_report_of_a_job_type_longer_than_the_admin_reads_is_streamed(
    pool: asyncpg.Pool, db_url: str, length: int
) -> None:
    """A progress report named the job's type whole: the hub, which reads the row's first
    TEXT_SHOWN characters, never matched it for a longer type and dropped the report, and past
    ~7,900 bytes NOTIFY refused the payload and the report was not stored at all. It now sends
    the type as the status-event trigger does, null when its JSON is over 512 bytes."""
    from sidelinja_worker.queue import store

    a = await make_workspace(pool, "A")
    job_type = "p" * length
    job = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload, status, worker_id, attempts)"
        " VALUES ($1, $2, '{}', 'running', $1, 1) RETURNING id",
        a,
        job_type,
    )
    hub = EventHub(db_url, pool)
    forwarded: asyncio.Queue[str] = asyncio.Queue()
    hub.payload_listeners.append(forwarded.put_nowait)
    await hub.start()
    stream = hub.stream(Scope(None, a))
    try:
        assert b"connected" in await anext(stream)
        await store.report_progress(pool, job, a, "Transkriberer…", 40)
        event = await data_frame(stream)
        sent = orjson.loads(await asyncio.wait_for(forwarded.get(), 10))
    finally:
        await stream.aclose()
        await hub.stop()
    for got in (event, sent):
        assert (got["id"], got["status"]) == (str(job), "running")
        assert got["progress"]["message"] == "Transkriberer…"
        assert got["job_type"] == job_type[:TEXT_SHOWN]
    stored = await pool.fetchval("SELECT progress->>'message' FROM job_queue WHERE id = $1", job)
    assert stored == "Transkriberer…"


def a_row(**values: Any) -> Any:
    """What store.jobs_for_events reads of a job (confirmed reads it by key)."""
    row = {
        "id": UUID(int=1),
        "workspace_id": UUID(int=2),
        "job_type": "noop",
        "status": "running",
        "attempts": 1,
        "max_attempts": 3,
        "progress": None,
    }
    return cast(asyncpg.Record, {**row, **values})


def a_status_claim(**values: Any) -> dict[str, Any]:
    claim = {
        "id": str(UUID(int=1)),
        "workspace_id": str(UUID(int=2)),
        "job_type": "noop",
        "status": "running",
        "max_attempts": 3,
        "attempts": 1,
    }
    return {**claim, **values}


def test_a_status_claim_with_its_type_left_out_is_confirmed_by_the_rest_of_the_row() -> None:
    long_type = "t" * TEXT_SHOWN  # the first TEXT_SHOWN characters of a longer one
    event = confirmed(a_status_claim(job_type=None), a_row(job_type=long_type))
    assert event is not None and event["job_type"] == long_type
    # Every other field the claim makes must still agree.
    for wrong in (
        {"status": "completed"},
        {"attempts": 2},
        {"max_attempts": 5},
        {"workspace_id": str(UUID(int=3))},
    ):
        assert confirmed(a_status_claim(job_type=None, **wrong), a_row()) is None, wrong
    assert confirmed(a_status_claim(job_type=None), None) is None


def test_a_claim_naming_a_type_must_name_the_row_s() -> None:
    assert confirmed(a_status_claim(), a_row()) is not None
    for claimed in ("noop2", "noo", "", 0, ["noop"], {"noop": 1}):
        assert confirmed(a_status_claim(job_type=claimed), a_row()) is None, claimed
    # A type longer than the admin reads agrees where the row's first characters are its own.
    cut = a_row(job_type="t" * TEXT_SHOWN)
    assert confirmed(a_status_claim(job_type="t" * 600), cut) is not None
    assert confirmed(a_status_claim(job_type="u" + "t" * 600), cut) is None
    assert confirmed(a_status_claim(job_type="t" * (TEXT_SHOWN - 1)), cut) is None
