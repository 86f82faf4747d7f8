"""Job events forwarded to a SpacetimeDB reducer over HTTP, against a real
HTTP server on 127.0.0.1 that checks the request as SpacetimeDB does and can fail with 530."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import httpx
import orjson
from aiohttp import web

from sidelinja_worker.admin.app import forwarding
from sidelinja_worker.admin.events import EventHub
from sidelinja_worker.admin.spacetime import SpacetimeTarget
from sidelinja_worker.queue.config import Secret
from tests.fakes.serve import serve
from tests.helpers import insert_jobs, make_workspace


def fake_spacetime(calls: list[Any], fail_first: bool) -> web.Application:
    async def call(request: web.Request) -> web.Response:
        if request.headers.get("content-type") != "application/json":
            return web.Response(status=415)
        if request.headers.get("authorization") != "Bearer stdb-token":
            return web.Response(status=403, text="client_connected rejected")
        args = await request.json()
        calls.append((request.match_info["db"], request.match_info["reducer"], args))
        if fail_first and len(calls) == 1:
            return web.Response(status=530, text="reducer panicked")
        return web.Response(status=200)  # committed: empty body

    app = web.Application()
    app.router.add_post("/v1/database/{db}/call/{reducer}", call)
    return app


async def test_events_reach_the_reducer_and_failures_are_dropped(
    pool: asyncpg.Pool, db_url: str
) -> None:
    calls: list[Any] = []
    workspace = await make_workspace(pool, "A")
    async with serve(fake_spacetime(calls, fail_first=True)) as url:
        hub = EventHub(db_url, pool)
        await hub.start()
        target = SpacetimeTarget(url, "sidelinja", "job_event", Secret("stdb-token"))
        try:
            async with forwarding(hub, target):
                await insert_jobs(pool, workspace, 2)  # answered 530: dropped, logged
                await insert_jobs(pool, workspace, 3)
                async with asyncio.timeout(10):
                    while len(calls) < 2:
                        await asyncio.sleep(0.05)
        finally:
            await hub.stop()
    assert [c[:2] for c in calls] == [("sidelinja", "job_event")] * 2
    second = orjson.loads(calls[1][2][0])  # one String argument: the event JSON
    assert second["workspace_id"] == str(workspace) and len(second["ids"]) == 3


async def test_an_unreachable_spacetimedb_changes_nothing(pool: asyncpg.Pool, db_url: str) -> None:
    hub = EventHub(db_url, pool)
    await hub.start()
    workspace = await make_workspace(pool, "A")
    try:
        async with forwarding(hub, SpacetimeTarget("http://127.0.0.1:9", "x")):
            await insert_jobs(pool, workspace, 1)
            await asyncio.sleep(0.3)
    finally:
        await hub.stop()
    assert await pool.fetchval("SELECT count(*) FROM job_queue") == 1
    assert httpx  # the forwarder's client library, imported here so a missing one fails loudly
