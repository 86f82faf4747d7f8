"""The admin web app: routes, each a few lines over admin/store.py and a template."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from uuid import UUID

import asyncpg
import httpx
from starlette.applications import Starlette
from starlette.datastructures import FormData
from starlette.requests import ClientDisconnect, Request
from starlette.responses import (
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import Receive, Send
from starlette.types import Scope as AsgiScope

from sidelinja_worker.admin import auth, dashboard, metrics_view, store, workflow
from sidelinja_worker.admin.events import EventHub, Subscription, TooManyStreams
from sidelinja_worker.admin.forms import (
    BadField,
    job_filter,
    page_cursor,
    parse_job_id,
    query_string,
    text_field,
)
from sidelinja_worker.admin.gate import (
    ACTION_TIMEOUT_S,
    READ_TIMEOUT_S,
    Busy,
    Gate,
    within_read_bound,
)
from sidelinja_worker.admin.spacetime import SpacetimeForwarder, SpacetimeTarget
from sidelinja_worker.admin.store import Scope
from sidelinja_worker.queue import store as worker_store
from sidelinja_worker.queue.db import SERVER_SETTINGS, init_connection

HERE = Path(__file__).parent
templates = Jinja2Templates(directory=str(HERE / "templates"))
BULK_LIMIT = 10_000
# Every form here is a CSRF value and a few short fields (a job filter, a job type and a reason):
# Starlette's own bounds (1,000 fields of 1 MB, files spooled to disk) let one request make the
# server hold a gigabyte, and logout reads its form for any cookie, before the session is checked.
FORM_FIELDS_MAX = 16
FORM_FIELD_MAX = 64 * 1024
# asyncpg's own timeout on every statement the admin runs (the pool's command_timeout, or given
# with the statement): this much past the database's bound, so PostgreSQL's cancel answers first
# (a clean error, the transaction rolled back); it ends only a wait on a connection that died
# without a word.
CLIENT_GRACE_S = 5.0
# A statement past its bound: PostgreSQL's statement_timeout (the read bound, or an action's),
# or, on a connection that no longer answers, asyncpg's timeout a little later.
TOO_SLOW = (asyncpg.QueryCanceledError, TimeoutError)


def read_bound_s(request: Request) -> float:
    """The client-side timeout of a page's statements of the engine's store."""
    return float(request.app.state.read_timeout_s) + CLIENT_GRACE_S


def action_bound_s(request: Request) -> float:
    """The client-side timeout of an action's statements (see acting)."""
    return float(request.app.state.action_timeout_s) + CLIENT_GRACE_S


@contextlib.asynccontextmanager
async def acting(request: Request, scope: Scope) -> AsyncIterator[asyncpg.Connection]:
    """store.scoped for an action: its statements run under the action bound, not the read
    bound, and a timeout names that bound."""
    bound = request.app.state.action_timeout_s
    request.state.bound_s = bound
    async with store.scoped(request.app.state.pool, scope, statement_timeout_s=bound) as conn:
        yield conn


async def read_form(request: Request) -> FormData:
    """The request's form within FORM_FIELDS_MAX and FORM_FIELD_MAX, no file; too big a form is
    a 400 (Starlette raises it as an HTTPException)."""
    return await request.form(max_files=0, max_fields=FORM_FIELDS_MAX, max_part_size=FORM_FIELD_MAX)


class Denied(Exception):
    pass


class Forbidden(Exception):
    pass


async def session(request: Request) -> tuple[Scope, str]:
    """The scope of the request's live token or session, and the secret its CSRF value is
    derived from; Denied otherwise."""
    credential = auth.presented(request)
    scope = await auth.scope_for(request.app.state.pool, credential)
    if scope is None or credential is None:
        raise Denied
    return scope, credential.secret


def render(
    request: Request,
    name: str,
    token: str,
    scope: Scope,
    status_code: int = 200,
    **context: object,
) -> Response:
    context.update(scope=scope, csrf=auth.csrf_for(token))
    return templates.TemplateResponse(request, name, context, status_code=status_code)


async def jobs_page(request: Request) -> Response:
    scope, token = await session(request)
    f = job_filter(request.query_params, scope)
    async with (
        request.app.state.reads.slot(scope.token_id),
        store.scoped(request.app.state.pool, scope) as conn,
    ):
        rows = await store.list_jobs(
            conn, f, page_cursor(request.query_params, f), store.PAGE_SIZE + 1
        )
    more = len(rows) > store.PAGE_SIZE
    rows = rows[: store.PAGE_SIZE]
    next_qs = query_string(f, rows[-1]) if more else None
    return render(
        request,
        "jobs.html",
        token,
        scope,
        rows=rows,
        f=f,
        next_qs=next_qs,
        workspaces=await visible_workspaces(request, scope),
        bulk_qs=query_string(f, None),
    )


async def visible_workspaces(request: Request, scope: Scope) -> list[asyncpg.Record]:
    return [w for w in await store.workspaces(request.app.state.pool) if scope.allows(w["id"])]


async def job_page(request: Request) -> Response:
    scope, token = await session(request)
    job_id = parse_job_id(request.path_params["job_id"])
    async with store.scoped(request.app.state.pool, scope) as conn:
        job = await store.get_job(conn, job_id) if job_id else None
    if job is None:  # another workspace's job looks exactly like a missing one
        return render(
            request,
            "missing.html",
            token,
            scope,
            status_code=404,
            job_id=request.path_params["job_id"],
        )
    return render(request, "job.html", token, scope, job=job)


async def workflow_page(request: Request) -> Response:
    """The graph the job belongs to, as the token's scope sees it: another workspace's job, or
    a job outside the scope, is a 404 like a missing one."""
    scope, token = await session(request)
    job_id = parse_job_id(request.path_params["job_id"])
    async with store.scoped(request.app.state.pool, scope) as conn:
        graph = await workflow.load(conn, job_id) if job_id else None
    if graph is None:
        return render(
            request,
            "missing.html",
            token,
            scope,
            status_code=404,
            job_id=request.path_params["job_id"],
        )
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
    pauses = [dict(p) for p in await worker_store.list_pauses(pool, timeout_s)]
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


def actor(scope: Scope) -> str:
    """Who, in the audit log, for an action taken in the admin view."""
    return f"admin token {scope.token_id}" if scope.token_id else "admin"


async def operator_form(request: Request) -> tuple[Scope, dict[str, str]]:
    """The form of a queue-wide action: a platform admin's, with its CSRF value; Denied or
    Forbidden otherwise (a workspace token steers its own jobs, never the whole queue)."""
    scope, token = await session(request)
    form = await read_form(request)
    if not auth.csrf_ok(request, token, str(form.get("csrf") or "")):
        raise Forbidden("bad CSRF token or origin")
    if scope.workspace_id is not None:
        raise Forbidden("only a platform admin token may pause, resume or drain")
    return scope, {k: text_field(form, k) for k in form}


async def pause_action(request: Request) -> Response:
    scope, form = await operator_form(request)
    job_type, reason = form.get("job_type", "").strip(), form.get("reason", "").strip()
    if not job_type or not reason:
        return PlainTextResponse("a job type and a reason are required", status_code=400)
    pool, timeout_s = request.app.state.pool, read_bound_s(request)
    if request.path_params["action"] == "pause":
        await worker_store.pause_type(pool, job_type, actor(scope), reason, timeout_s)
    else:
        await worker_store.resume_type(pool, job_type, actor(scope), reason, timeout_s)
    return RedirectResponse(f"/admin?done={request.path_params['action']}", status_code=303)


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


async def drain_action(request: Request) -> Response:
    scope, form = await operator_form(request)
    worker_id = parse_job_id(request.path_params["worker_id"])
    drain = form.get("drain") != "0"
    if worker_id is None or not await worker_store.drain_worker(
        request.app.state.pool, worker_id, actor(scope), drain, read_bound_s(request)
    ):
        return PlainTextResponse("no such worker", status_code=404)
    await store.audit_queue(
        request.app.state.pool,
        scope,
        "drain" if drain else "undrain",
        {"worker_id": str(worker_id)},
    )
    return RedirectResponse("/admin/workers", status_code=303)


async def job_action(request: Request) -> Response:
    scope, token = await session(request)
    form = await read_form(request)
    if not auth.csrf_ok(request, token, str(form.get("csrf") or "")):
        return PlainTextResponse("bad CSRF token or origin", status_code=403)
    job_id, action = parse_job_id(request.path_params["job_id"]), request.path_params["action"]
    try:
        async with acting(request, scope) as conn:
            timeout_s = action_bound_s(request)
            target = None if job_id is None else await run_action(conn, action, job_id, timeout_s)
            done = target is not None
            if target is not None:
                # A retry of a node cancelled by its parent puts back the failed ancestor: the
                # audit names the job put back, and the one the operator clicked.
                detail = {} if target == job_id else {"asked_for": str(job_id)}
                await store.audit(conn, scope, action, [target], detail)
    except asyncpg.UniqueViolationError:
        return PlainTextResponse(store.KEY_HELD, status_code=409)
    return RedirectResponse(
        f"/admin/jobs/{request.path_params['job_id']}?done={action if done else 'none'}",
        status_code=303,
    )


async def run_action(
    conn: asyncpg.Connection, action: str, job_id: UUID, timeout_s: float
) -> UUID | None:
    """The id of the job the action changed, or None if it changed nothing. `conn` is
    acting()'s; timeout_s is asyncpg's for its statements (a cancel runs through the job's
    graph, a retry may bring a branch back)."""
    if action == "retry":
        return await store.retry_node(conn, job_id, timeout_s)
    if action == "cancel":
        return job_id if (await worker_store.request_cancel(conn, job_id, timeout_s))[0] else None
    return None


async def bulk_retry(request: Request) -> Response:
    scope, token = await session(request)
    form = await read_form(request)
    if not auth.csrf_ok(request, token, str(form.get("csrf") or "")):
        return PlainTextResponse("bad CSRF token or origin", status_code=403)
    f = job_filter(form, scope)
    try:
        async with request.app.state.reads.slot(scope.token_id), acting(request, scope) as conn:
            ids = await store.bulk_retry(conn, f, BULK_LIMIT, action_bound_s(request))
            await store.audit(conn, scope, "bulk_retry", ids, {"filter": query_string(f, None)})
    except asyncpg.UniqueViolationError:  # a job a retried one brings back (store.KEY_HELD)
        return PlainTextResponse(store.KEY_HELD, status_code=409)
    return RedirectResponse(
        f"/admin/jobs?{query_string(f, None)}&retried={len(ids)}", status_code=303
    )


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

    queue = hub.subscribe(scope)  # TooManyStreams past the caps
    return EventStream(hub, queue, hub.frames(queue, still_valid))


async def login_page(request: Request) -> Response:
    return templates.TemplateResponse(request, "login.html", {"error": None})


CROSS_SITE = "cross-site request refused (Origin or Sec-Fetch-Site is not this site)"


async def login(request: Request) -> Response:
    """Checks the token and opens a session of its own (the cookie never holds the token).
    Refused from another site, so no page elsewhere can log a browser in to its token."""
    if not auth.same_origin(request):
        return PlainTextResponse(CROSS_SITE, status_code=403)
    pool = request.app.state.pool
    # Too big a form is a 400 (Starlette raises it as an HTTPException).
    form = await request.form(
        max_files=0, max_fields=auth.LOGIN_FIELDS_MAX, max_part_size=auth.LOGIN_FIELD_MAX
    )
    scope = await auth.scope_of(pool, str(form.get("token") or "").strip())
    if scope is None:
        return templates.TemplateResponse(
            request, "login.html", {"error": "unknown or revoked token"}, status_code=401
        )
    secret = auth.new_session_secret()
    await store.create_session(pool, auth.digest(secret), scope.token_id, auth.SESSION_LIFETIME_S)
    response = RedirectResponse("/admin/jobs", status_code=303)
    response.set_cookie(
        auth.COOKIE,
        secret,
        httponly=True,
        secure=True,
        samesite="strict",
        path="/",
        max_age=auth.SESSION_LIFETIME_S,
    )
    return response


async def logout(request: Request) -> Response:
    """Ends the session on the server too. Same-site requests only, carrying the session's CSRF
    value: no other page can log a user out."""
    credential = auth.presented(request)
    if credential is not None and credential.is_session:
        form = await read_form(request)
        if not auth.csrf_ok(request, credential.secret, str(form.get("csrf") or "")):
            return PlainTextResponse("bad CSRF token or origin", status_code=403)
        await store.delete_session(request.app.state.pool, auth.digest(credential.secret))
    elif not auth.same_origin(request):
        return PlainTextResponse(CROSS_SITE, status_code=403)
    response = RedirectResponse("/admin/login", status_code=303)
    response.delete_cookie(auth.COOKIE, path="/", secure=True, httponly=True, samesite="strict")
    return response


async def metrics(request: Request) -> Response:
    scope, _token = await session(request)
    async with (
        request.app.state.reads.slot(scope.token_id),
        store.scoped(request.app.state.pool, scope) as conn,
    ):
        body = await metrics_view.render(conn, read_bound_s(request))
    return Response(body, media_type=metrics_view.CONTENT_TYPE)


async def denied(request: Request, _exc: Exception) -> Response:
    """A browser loading a page goes to the login page; everything else (scripts, API clients,
    the event stream, /metrics) gets 401 (auth.is_browser_navigation says which is which)."""
    if (
        request.url.path.startswith("/admin")
        and request.url.path != "/admin/events"
        and auth.is_browser_navigation(request)
    ):
        return RedirectResponse("/admin/login", status_code=303)
    headers = {"www-authenticate": 'Bearer realm="sidelinja-admin"'}
    if "application/json" in request.headers.get("accept", ""):
        return JSONResponse(
            {"error": "a valid admin token is required"}, status_code=401, headers=headers
        )
    return PlainTextResponse("a valid admin token is required", status_code=401, headers=headers)


async def forbidden(_request: Request, exc: Exception) -> Response:
    return PlainTextResponse(str(exc), status_code=403)


async def bad_field(_request: Request, exc: Exception) -> Response:
    return PlainTextResponse(str(exc), status_code=400)


async def too_many_streams(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, TooManyStreams)
    return PlainTextResponse(str(exc), status_code=exc.status_code)


async def busy(_request: Request, exc: Exception) -> Response:
    return PlainTextResponse(str(exc), status_code=429)


async def gone(_request: Request, _exc: Exception) -> Response:
    """The client left (or was cut off, its request overdue: arrival.py) before its body was
    read: nobody receives this answer, and it is no error of the app's to log."""
    return Response(status_code=400)


async def too_slow(request: Request, _exc: Exception) -> Response:
    """503 with one line naming the bound, never a traceback; the connection went back to the
    pool with its transaction rolled back. A page asked for as HTML gets a page, a client that
    accepts JSON gets JSON, anything else (/metrics, scripts) the line as text."""
    bound = getattr(request.state, "bound_s", request.app.state.read_timeout_s)
    if request.method == "POST":
        line = f"the database took longer than {bound:g} s for this action; nothing was changed"
    else:
        line = f"the database took longer than {bound:g} s for this page; try a narrower filter"
    accept = request.headers.get("accept", "")
    if "application/json" in accept:
        return JSONResponse({"error": line}, status_code=503)
    if "text/html" in accept or auth.is_browser_navigation(request):
        return templates.TemplateResponse(request, "slow.html", {"line": line}, status_code=503)
    return PlainTextResponse(line, status_code=503)


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


async def home(_request: Request) -> Response:
    return RedirectResponse("/admin/jobs")


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
            **SERVER_SETTINGS,
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
