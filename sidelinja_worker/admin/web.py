"""What every route of the admin view shares: the session behind a request, its page's
template, its form within bounds, and the bounds its statements run under."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.templating import Jinja2Templates
from starlette.types import Message

from sidelinja_worker.admin import auth, store
from sidelinja_worker.admin.pauses import ACTOR_PREFIX
from sidelinja_worker.admin.store import Scope

HERE = Path(__file__).parent


def shown_at(value: object, precise: bool = False) -> str:
    """A time as every page shows it, in UTC (the pages say so), to the second, or to the
    millisecond where it is one job's record (its page). A text is a time from a JSON value (an
    error history's `at`, which any plain-SQL writer may make anything): shown the same way
    when it reads as a time, as it is otherwise, like any other value."""
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            value = datetime.fromisoformat(value)
    if not isinstance(value, datetime):
        return "" if value is None else str(value)
    if value.tzinfo is not None:
        with contextlib.suppress(OverflowError):  # year 1 east of UTC: shown in its own zone
            value = value.astimezone(UTC)
    text = value.strftime("%Y-%m-%d %H:%M:%S")
    return f"{text}.{value.microsecond // 1000:03d}" if precise else text


templates = Jinja2Templates(directory=str(HERE / "templates"))
templates.env.filters["short_id"] = store.short_id
templates.env.filters["at"] = shown_at


# Every form here is a CSRF value and a few short fields (a job filter, a job type and a reason):
# Starlette's own bounds (1,000 fields of 1 MB, files spooled to disk) let one request make the
# server hold a gigabyte, and logout reads its form for any cookie, before the session is checked.
FORM_FIELDS_MAX = 16


FORM_FIELD_MAX = 64 * 1024

# A whole form's body, at most: its one long field (a payload filter) and the short ones. The
# field bounds count fields and their sizes, not the body: a body of nothing but separators
# ("&&&...") holds no field at all, and every byte of it was parsed, in Python, on the loop that
# serves every request (8 MB: 1.8 s; and 44 MB arrive within the arrival bound).
FORM_BODY_MAX = 2 * FORM_FIELD_MAX


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


async def read_form(
    request: Request,
    fields: int = FORM_FIELDS_MAX,
    field_bytes: int = FORM_FIELD_MAX,
    body_bytes: int = FORM_BODY_MAX,
) -> FormData:
    """The request's form within `fields` fields of `field_bytes` and a body of `body_bytes`,
    no file; too big a form is a 400. The body is read whole before a byte is parsed, and one
    declared or found over its bound is refused as it arrives."""
    body = await _body_within(request, body_bytes)

    async def replay() -> Message:
        return {"type": "http.request", "body": body, "more_body": False}

    # Starlette's parsers, on the body already read (they raise a too-big form as a 400).
    return await Request(request.scope, replay).form(
        max_files=0, max_fields=fields, max_part_size=field_bytes
    )


async def _body_within(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared and not (declared.isascii() and declared.isdigit() and int(declared) <= limit):
        raise HTTPException(400, f"form too large (over {limit} bytes)")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise HTTPException(400, f"form too large (over {limit} bytes)")
    return bytes(body)


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
    # Kept for an answer that has no page of its own to render (answers.too_slow), so it can
    # still show the navigation bar of the session it answers.
    request.state.scope, request.state.secret = scope, credential.secret
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


def actor(scope: Scope) -> str:
    """Who, in the audit log, for an action taken in the admin view: the token's id, which
    stays true when its label changes or its row goes (pauses.author_token reads it back)."""
    return f"{ACTOR_PREFIX}{scope.token_id}" if scope.token_id else "admin"
