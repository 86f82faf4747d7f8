"""The admin web app: its routes, the errors it answers for them, and the lifespan that holds
its database pool and live event hub."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import asyncpg
import httpx
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from sidelinja_worker.admin import auth
from sidelinja_worker.admin.actions import (
    bulk_retry,
    drain_action,
    job_action,
    login,
    logout,
    pause_action,
)
from sidelinja_worker.admin.answers import (
    bad_field,
    busy,
    denied,
    forbidden,
    gone,
    too_many_streams,
    too_slow,
)
from sidelinja_worker.admin.events import EventHub, TooManyStreams
from sidelinja_worker.admin.forms import BadField
from sidelinja_worker.admin.gate import (
    ACTION_TIMEOUT_S,
    READ_TIMEOUT_S,
    Busy,
    Gate,
    within_read_bound,
)
from sidelinja_worker.admin.pages import (
    dashboard_page,
    events,
    home,
    job_page,
    jobs_page,
    login_page,
    metrics,
    overview_page,
    workers_page,
    workflow_page,
)
from sidelinja_worker.admin.spacetime import SpacetimeForwarder, SpacetimeTarget
from sidelinja_worker.admin.web import CLIENT_GRACE_S, HERE, Denied, Forbidden
from sidelinja_worker.queue.db import init_connection, server_settings


@contextlib.asynccontextmanager
async def forwarding(hub: EventHub, target: SpacetimeTarget | None) -> AsyncIterator[None]:
    """Forwards the hub's payloads to SpacetimeDB while the app runs, if a target is set."""
    if target is None:
        yield
        return
    async with httpx.AsyncClient() as http:
        forwarder = SpacetimeForwarder(target, http)
        hub.payload_listeners.append(forwarder.offer)
        task = asyncio.create_task(forwarder.run(), name="spacetimedb")
        try:
            yield
        finally:
            task.cancel()


ROUTES = [
    Route("/", home),
    Route("/admin", within_read_bound(overview_page)),
    Route("/admin/jobs", within_read_bound(jobs_page)),
    Route("/admin/jobs/bulk-retry", bulk_retry, methods=["POST"]),
    Route("/admin/jobs/{job_id}", within_read_bound(job_page)),
    Route("/admin/jobs/{job_id}/graph", within_read_bound(workflow_page)),
    Route("/admin/jobs/{job_id}/{action:str}", job_action, methods=["POST"]),
    Route("/admin/pauses/{action:str}", pause_action, methods=["POST"]),
    Route("/admin/dashboard", within_read_bound(dashboard_page)),
    Route("/admin/workers", within_read_bound(workers_page)),
    Route("/admin/workers/{worker_id}/drain", drain_action, methods=["POST"]),
    Route("/admin/events", events),
    Route("/metrics", within_read_bound(metrics)),
    Route("/admin/login", login_page),
    Route("/admin/login", login, methods=["POST"]),
    Route("/admin/logout", logout, methods=["POST"]),
    Mount("/admin/static", StaticFiles(directory=str(HERE / "static")), name="static"),
]


def create_app(
    database_url: str,
    spacetime: SpacetimeTarget | None = None,
    read_timeout_s: float = READ_TIMEOUT_S,
) -> Starlette:
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # Custom plans: the list query's optional filters need the planner to see the values.
        # Every statement on the pool gives up at the read bound (gate.READ_TIMEOUT_S); an
        # action raises it for its own transaction (acting). The event hub's LISTEN has a
        # connection of its own, outside the pool: an idle stream holds no statement.
        settings = {
            **server_settings(),
            "application_name": "sidelinja-admin",
            "plan_cache_mode": "force_custom_plan",
            "statement_timeout": str(round(read_timeout_s * 1000)),
        }
        app.state.read_timeout_s = read_timeout_s
        app.state.action_timeout_s = max(ACTION_TIMEOUT_S, read_timeout_s)
        # asyncpg's own bound on every statement, past the database's: it ends only a wait on
        # a connection that no longer answers (a dead network path: no reset, no answer), which
        # without it kept each page that took such a connection for good. An action's
        # statements give their own, past the action bound.
        app.state.pool = await asyncpg.create_pool(
            database_url,
            min_size=1,
            max_size=8,
            init=init_connection,
            server_settings=settings,
            command_timeout=read_timeout_s + CLIENT_GRACE_S,
        )
        app.state.hub = EventHub(database_url, app.state.pool)
        app.state.reads = Gate()
        await app.state.hub.start()
        try:
            async with forwarding(app.state.hub, spacetime):
                yield
        finally:
            await app.state.hub.stop()
            await app.state.pool.close()

    app = Starlette(
        routes=ROUTES,
        lifespan=lifespan,
        exception_handlers={
            Denied: denied,
            Forbidden: forbidden,
            BadField: bad_field,
            TooManyStreams: too_many_streams,
            Busy: busy,
            ClientDisconnect: gone,
            asyncpg.QueryCanceledError: too_slow,  # TOO_SLOW
            TimeoutError: too_slow,
        },
    )
    app.add_middleware(auth.SecurityHeaders)
    return app
