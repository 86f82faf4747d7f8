"""The admin view's actions: retry, cancel and bulk retry of jobs, pause, resume and drain, log
in and out. Each is a POST with its CSRF value, run under the action bound."""

from __future__ import annotations

from uuid import UUID

import asyncpg
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response

from sidelinja_worker.admin import auth, store
from sidelinja_worker.admin.forms import (
    DEFAULT_STATUS,
    STATUSES,
    job_filter,
    parse_job_id,
    query_string,
    text_field,
)
from sidelinja_worker.admin.pauses import pausable
from sidelinja_worker.admin.store import Scope
from sidelinja_worker.admin.web import (
    Forbidden,
    acting,
    action_bound_s,
    actor,
    read_bound_s,
    read_form,
    session,
    templates,
)
from sidelinja_worker.jobs.catalog import REGISTRY
from sidelinja_worker.queue import store as worker_store

BULK_LIMIT = 10_000
# The actions the routes' {action} names; any other is a 404. Anything but "pause" resumed,
# and a job action of another name answered as if the job were in no state for it.
PAUSE_ACTIONS = ("pause", "resume")
JOB_ACTIONS = ("retry", "cancel")
# What the overview says when a pause or resume changed nothing (its `done`): a type paused
# already keeps its first pause, its author and reason.
UNCHANGED = {"pause": "paused-already", "resume": "not-paused"}
NO_SUCH_ACTION = "no such action"


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
    action = request.path_params["action"]
    if action not in PAUSE_ACTIONS:
        return PlainTextResponse(NO_SUCH_ACTION, status_code=404)
    job_type, reason = form.get("job_type", "").strip(), form.get("reason", "").strip()
    if not job_type or not reason:
        return PlainTextResponse("a job type and a reason are required", status_code=400)
    pool, timeout_s = request.app.state.pool, read_bound_s(request)
    if action == "pause" and not await pausable(pool, job_type, timeout_s):
        known = ", ".join(sorted(REGISTRY))
        return PlainTextResponse(
            f"unknown job type {job_type!r}: no job has it and this installation runs no such"
            f" type (known: {known}); nothing was paused",
            status_code=400,
        )
    change = worker_store.pause_type if action == "pause" else worker_store.resume_type
    changed = await change(pool, job_type, actor(scope), reason, timeout_s)
    done = action if changed else UNCHANGED[action]
    return RedirectResponse(f"/admin?done={done}", status_code=303)


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
    if action not in JOB_ACTIONS:
        return PlainTextResponse(NO_SUCH_ACTION, status_code=404)
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
    # A list reads an unknown status as all of them; a bulk retry that widened a mistyped
    # status to every failed job of the filter would do far more than it was asked.
    if str(form.get("status") or DEFAULT_STATUS) not in (*STATUSES, "all"):
        return PlainTextResponse("status: unknown; nothing was retried", status_code=400)
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


CROSS_SITE = "cross-site request refused (Origin or Sec-Fetch-Site is not this site)"


async def login(request: Request) -> Response:
    """Checks the token and opens a session of its own (the cookie never holds the token).
    Refused from another site, so no page elsewhere can log a browser in to its token."""
    if not auth.same_origin(request):
        return PlainTextResponse(CROSS_SITE, status_code=403)
    pool = request.app.state.pool
    form = await read_form(
        request, auth.LOGIN_FIELDS_MAX, auth.LOGIN_FIELD_MAX, auth.LOGIN_BODY_MAX
    )
    scope = await auth.scope_of(pool, str(form.get("token") or "").strip())
    landing = auth.landing(str(form.get("next") or ""))
    if scope is None:
        context = {"error": "unknown or revoked token", "next": landing}
        return templates.TemplateResponse(request, "login.html", context, status_code=401)
    secret = auth.new_session_secret()
    await store.create_session(pool, auth.digest(secret), scope.token_id, auth.SESSION_LIFETIME_S)
    response = RedirectResponse(landing, status_code=303)
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
