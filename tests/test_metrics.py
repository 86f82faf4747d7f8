"""/metrics is safe by default: it binds 127.0.0.1, answers from gauges one task refreshes (no
query per scrape), drops a client that sends nothing; the event loop's lag is a gauge."""

from __future__ import annotations

import asyncio
import time
from typing import Any
from uuid import UUID

import asyncpg
import pytest

from sidelinja_worker.queue import metrics, store
from tests.helpers import insert_jobs, metrics_text, wait_for


async def test_loop_lag_is_measured_and_a_blocked_loop_said(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A handler that blocks the loop showed only in the gauge; past LOOP_BLOCKED_WARN_S it
    is a warning too."""
    monkeypatch.setattr(metrics, "LOOP_BLOCKED_WARN_S", 0.2)
    task = asyncio.create_task(metrics.lag_loop(0.02))
    try:
        await asyncio.sleep(0)  # the task starts: its tick's sleep is under way
        time.sleep(0.3)  # noqa: ASYNC251  (the point: a handler that blocks the loop)

        async def lagged() -> bool:
            return metrics.LOOP_LAG._value.get() >= 0.2

        await wait_for(lagged)
        assert "sidelinja_event_loop_lag_seconds" in (await _scrape_once())
        assert any("the event loop was blocked" in r.message for r in caplog.records)
    finally:
        task.cancel()


async def _scrape_once() -> str:
    return metrics.generate_latest(metrics.REGISTRY).decode()


async def test_scrapes_answer_from_the_cache_refreshed_by_one_task(
    pool: asyncpg.Pool, workspace: UUID, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = 0
    counts = metrics.store.counts

    async def counting(conn: Any) -> Any:
        nonlocal calls
        calls += 1
        return await counts(conn)

    monkeypatch.setattr(metrics.store, "counts", counting)
    await insert_jobs(pool, workspace, 2)
    server = await metrics.serve(pool, 0)
    host, port = server.sockets[0].getsockname()[:2]
    assert host == "127.0.0.1"  # not reachable from other machines unless asked for
    refresher = None
    try:
        for _ in range(30):
            body = await metrics_text(port)
            assert body is not None and 'status="pending"} 2.0' in body
        assert calls == 1  # the read at start; thirty scrapes ran no query
        refresher = asyncio.create_task(metrics.gauge_loop(pool, 0.1))
        await insert_jobs(pool, workspace, 3)

        async def refreshed() -> bool:
            return 'status="pending"} 5.0' in (await metrics_text(port) or "")

        await wait_for(refreshed)
        assert calls < 30
    finally:
        if refresher is not None:
            refresher.cancel()
        server.close()
        await server.wait_closed()


async def test_a_client_that_sends_nothing_is_dropped(
    pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(metrics, "REQUEST_TIMEOUT_S", 0.3)
    server = await metrics.serve(pool, 0)
    port = server.sockets[0].getsockname()[1]
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        began = time.monotonic()
        # Meanwhile another client is served.
        assert (await metrics_text(port) or "").startswith("HTTP/1.1 200")
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the server
        assert time.monotonic() - began < 3
        writer.close()
        await writer.wait_closed()
    finally:
        server.close()
        await server.wait_closed()


async def test_the_notification_queue_usage_is_a_gauge(pool: asyncpg.Pool, db_url: str) -> None:
    """A session that LISTENs and then sits in an open transaction holds the queue's tail; the
    refresh reads the usage and, with the threshold at its smallest, that status events pause."""
    await pool.execute(
        "UPDATE queue_settings SET value = '0.000000001' WHERE name = 'job_events_max_queue_usage'"
    )
    stuck = await asyncpg.connect(db_url)
    await stuck.execute("LISTEN sidelinja_test_stuck")
    await stuck.execute("BEGIN")  # notifications are never delivered inside a transaction
    try:
        # The queue is the cluster's and counts whole pages: 8 kB payloads fill one each.
        for _ in range(20):
            await pool.execute("SELECT pg_notify('sidelinja_test_stuck', repeat('y', 7900))")
            if await pool.fetchval("SELECT pg_notification_queue_usage() > 0"):
                break
        await metrics._refresh_gauges(pool)
        body = await _scrape_once()
        usage = next(
            float(line.split()[-1])
            for line in body.splitlines()
            if line.startswith("sidelinja_notify_queue_usage ")
        )
        assert 0 < usage < 0.5
        assert 'sidelinja_notify_paused{kind="job_events"} 1.0' in body
        assert 'sidelinja_notify_paused{kind="wakeups"} 0.0' in body
    finally:
        await stuck.close()
    await pool.execute(
        "UPDATE queue_settings SET value = '0.5' WHERE name = 'job_events_max_queue_usage'"
    )
    await metrics._refresh_gauges(pool)
    assert 'sidelinja_notify_paused{kind="job_events"} 0.0' in await _scrape_once()


async def test_the_counts_by_type_stay_bounded_whatever_types_the_table_holds(
    pool: asyncpg.Pool, workspace: UUID
) -> None:
    """A job type is text of any length and number to a plain-SQL writer: the gauges (and the
    admin's overview and metrics) had a series per type, whole: 150 types made 150 series and
    a type of a megabyte a label of a megabyte. At most COUNTS_MAX_TYPES types per status are
    named, by their first 512 characters; the rest are counted together."""
    await pool.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload)"
        " SELECT $1::uuid, 'type-' || g, '{}'::jsonb FROM generate_series(1, 150) g"
        " UNION ALL SELECT $1, repeat('t', 1000000), '{}' FROM generate_series(1, 3)",
        workspace,
    )
    rows = await store.counts(pool)
    named = [r for r in rows if r["job_type"] is not None]
    assert len(named) == store.COUNTS_MAX_TYPES
    assert named[0]["job_type"] == "t" * 512 and named[0]["n"] == 3  # the most numerous
    assert sum(r["n"] for r in rows) == 153
    assert [r["n"] for r in rows if r["job_type"] is None] == [153 - 3 - 99]
