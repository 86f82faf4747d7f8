"""The admin view's pages, each a few lines over admin/store.py and a template, and its live
event stream; none changes a row."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any
from uuid import UUID

import asyncpg
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response, StreamingResponse
from starlette.types import Receive, Send
from starlette.types import Scope as AsgiScope

from sidelinja_worker.admin import auth, dashboard, metrics_view, store, workflow
from sidelinja_worker.admin.events import EventHub, Subscription, snapshot_ids
from sidelinja_worker.admin.forms import (
    TIME_FORMAT,
    job_filter,
    page_cursor,
    parse_job_id,
    query_string,
)
from sidelinja_worker.admin.pauses import name_authors
from sidelinja_worker.admin.store import Scope
from sidelinja_worker.admin.web import (
    TOO_SLOW,
    read_bound_s,
    render,
    session,
    templates,
)
from sidelinja_worker.queue import store as worker_store


async def home(_request: Request) -> Response:
    return RedirectResponse("/admin/jobs")


async def jobs_page(request: Request) -> Response:
    """A page of the list, by keyset: the first, the one after an "Older" link's cursor, or
    the one before a "Newer" link's. A "Newer" page that would reach the top of the list is
    the first page itself, so it is full and shows no link back further."""
    scope, token = await session(request)
    f = job_filter(request.query_params, scope)
    after = page_cursor(request.query_params, f)
    before = None if after else page_cursor(request.query_params, f, "before")
    async with (
        request.app.state.reads.slot(scope.token_id),
        store.scoped(request.app.state.pool, scope) as conn,
    ):
        rows = []
        if before is not None:
            rows = await store.list_jobs(conn, f, before, store.PAGE_SIZE + 1, newer=True)
        if len(rows) > store.PAGE_SIZE:  # a page before the cursor, and more before it
            rows, older, first_page = rows[1:], True, False
        else:
            rows = await store.list_jobs(conn, f, after, store.PAGE_SIZE + 1)
            older, first_page = len(rows) > store.PAGE_SIZE, after is None
            rows = rows[: store.PAGE_SIZE]
    return render(
        request,
        "jobs.html",
        token,
        scope,
        rows=rows,
        f=f,
        next_qs=query_string(f, rows[-1]) if older else None,
        newer_qs=query_string(f, rows[0], "before") if rows and not first_page else None,
        newest_qs=None if first_page else query_string(f, None),
        time_format=TIME_FORMAT,
        workspaces=await visible_workspaces(request, scope),
        bulk_qs=query_string(f, None),
    )


async def visible_workspaces(request: Request, scope: Scope) -> list[asyncpg.Record]:
    return [w for w in await store.workspaces(request.app.state.pool) if scope.allows(w["id"])]


def missing(request: Request, token: str, scope: Scope) -> Response:
    """The 404 of a job page: another workspace's job looks exactly like a missing one."""
    return render(request, "missing.html", token, scope, 404, job_id=request.path_params["job_id"])


async def job_page(request: Request) -> Response:
    scope, token = await session(request)
    job_id = parse_job_id(request.path_params["job_id"])
    async with store.scoped(request.app.state.pool, scope) as conn:
        job = await store.get_job(conn, job_id) if job_id else None
    if job is None:
        return missing(request, token, scope)
    return render(request, "job.html", token, scope, job=job)


async def workflow_page(request: Request) -> Response:
    """The graph the job belongs to, as the token's scope sees it: another workspace's job, or
    a job outside the scope, is a 404 like a missing one."""
    scope, token = await session(request)
    job_id = parse_job_id(request.path_params["job_id"])
    async with store.scoped(request.app.state.pool, scope) as conn:
        graph = await workflow.load(conn, job_id) if job_id else None
    if graph is None:
        return missing(request, token, scope)
    return render(
        request,
        "workflow.html",
        token,
        scope,
        g=graph,
        max_nodes=workflow.MAX_NODES,
        max_edges=workflow.MAX_EDGES,
        node_w=workflow.NODE_W,
        node_h=workflow.NODE_H,
    )


async def overview_page(request: Request) -> Response:
    scope, token = await session(request)
    async with request.app.state.reads.slot(scope.token_id):
        figures = await overview_figures(request.app.state.pool, scope, read_bound_s(request))
    return render(
        request, "overview.html", token, scope, done=request.query_params.get("done"), **figures
    )


async def overview_figures(pool: asyncpg.Pool, scope: Scope, timeout_s: float) -> dict[str, Any]:
    """timeout_s: asyncpg's, for the engine's statements (read_bound_s)."""
    # Limits and pauses are queue-wide configuration, read with the privileged pool; a workspace
    # token sees every type and rate limit but no other workspace's cap. The jobs counted beside
    # them are read under the scope below: their own queries count every workspace's.
    limits = [
        dict(r)
        for r in await worker_store.list_limits(pool, timeout_s)
        if r["kind"] != "workspace"
        or scope.workspace_id is None
        or r["name"] == str(scope.workspace_id)
    ]
    capped = [UUID(r["name"]) for r in limits if r["kind"] == "workspace"]
    names = await store.workspace_names(pool, capped, timeout_s) if capped else {}
    for r in limits:
        # The table's name of a workspace cap is the workspace's id (what `limits workspace`
        # takes); a reader knows a workspace by its name, shown beside it.
        if r["kind"] == "workspace":
            r["workspace"] = names.get(UUID(r["name"]))
    pauses = [dict(p) for p in await worker_store.list_pauses(pool, timeout_s)]
    await name_authors(pool, pauses, timeout_s)
    types = [r["name"] for r in limits if r["kind"] == "job type"] + [p["job_type"] for p in pauses]
    async with store.scoped(pool, scope) as conn:
        counts = await worker_store.counts(conn, timeout_s)
        oldest = await worker_store.oldest_due_s(conn, timeout_s)
        per_minute = await store.throughput(conn)
        of_type = {r["job_type"]: r for r in await store.type_counts(conn, types)}
    none = {"waiting": 0, "running": 0}
    for r in limits:
        if r["kind"] == "job type":
            r["running"] = of_type.get(r["name"], none)["running"]
    for p in pauses:
        p["waiting"] = of_type.get(p["job_type"], none)["waiting"]
    return {
        "counts": counts,
        "oldest_due_s": oldest,
        "per_minute": per_minute,
        "finished": sum(r["n"] for r in per_minute),
        "limits": limits,
        "pauses": pauses,
    }


async def dashboard_page(request: Request) -> Response:
    scope, token = await session(request)
    async with (
        request.app.state.reads.slot(scope.token_id),
        store.scoped(request.app.state.pool, scope) as conn,
    ):
        now = await conn.fetchval("SELECT now()")
        figures = await dashboard.load(conn, scope, now, read_bound_s(request))
    pauses = await worker_store.list_pauses(request.app.state.pool, read_bound_s(request))
    paused = {p["job_type"] for p in pauses}
    context: dict[str, Any] = {
        "d": figures,
        "chart": dashboard.chart,
        "paused": paused,
        "inf": float("inf"),
    }
    if request.query_params.get("part"):
        return templates.TemplateResponse(request, "dashboard_body.html", context)
    return render(request, "dashboard.html", token, scope, 200, **context)


async def workers_page(request: Request) -> Response:
    scope, token = await session(request)
    # Under the scope: a workspace token sees every worker but only its own jobs on them.
    async with store.scoped(request.app.state.pool, scope) as conn:
        workers = await worker_store.list_workers(conn, read_bound_s(request))
    return render(request, "workers.html", token, scope, workers=workers)


async def metrics(request: Request) -> Response:
    scope, _token = await session(request)
    async with (
        request.app.state.reads.slot(scope.token_id),
        store.scoped(request.app.state.pool, scope) as conn,
    ):
        body = await metrics_view.render(conn, read_bound_s(request))
    return Response(body, media_type=metrics_view.CONTENT_TYPE)


class EventStream(StreamingResponse):
    """The live stream's response. It gives the stream's place in the hub back however it ends,
    also before its first frame (a client gone at once), when the frames never start."""

    def __init__(self, hub: EventHub, queue: Subscription, frames: AsyncIterator[bytes]) -> None:
        super().__init__(
            frames, media_type="text/event-stream", headers={"x-accel-buffering": "no"}
        )
        self._hub, self._queue = hub, queue

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._hub.unsubscribe(self._queue)


async def events(request: Request) -> Response:
    scope, _secret = await session(request)
    pool, credential = request.app.state.pool, auth.presented(request)
    hub: EventHub = request.app.state.hub

    async def still_valid() -> bool:
        """A check the database does not answer within the read bound ends the stream: the
        page reconnects in 2 s (its `retry`) and is checked afresh."""
        try:
            return await auth.scope_for(pool, credential) == scope
        except TOO_SLOW:
            return False

    async def present() -> list[dict[str, Any]]:
        """The page's jobs as they are now; none when the database does not answer in time
        (the events that follow still come)."""
        try:
            return await hub.snapshot(scope, snapshot_ids(request.query_params.get("jobs", "")))
        except TOO_SLOW:
            return []

    queue = hub.subscribe(scope)  # TooManyStreams past the caps
    return EventStream(hub, queue, hub.frames(queue, still_valid, present))


async def login_page(request: Request) -> Response:
    landing = auth.landing(request.query_params.get("next", ""))
    return templates.TemplateResponse(request, "login.html", {"error": None, "next": landing})
