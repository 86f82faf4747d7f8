"""The admin view's answers to a request it refuses or cannot serve: who is not logged in,
what is not allowed, too much asked at once, too slow a database. Never a traceback."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response

from sidelinja_worker.admin import auth
from sidelinja_worker.admin.events import TooManyStreams
from sidelinja_worker.admin.web import templates


async def denied(request: Request, _exc: Exception) -> Response:
    """A browser loading a page goes to the login page; everything else (scripts, API clients,
    the event stream, /metrics) gets 401 (auth.is_browser_navigation says which is which)."""
    if (
        request.url.path.startswith("/admin")
        and request.url.path != "/admin/events"
        and auth.is_browser_navigation(request)
    ):
        return RedirectResponse(auth.login_url(request), status_code=303)
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


def page_frame(request: Request, line: str) -> dict[str, object]:
    """What the 503 page needs for the navigation bar every page has: the session's scope and
    CSRF value once the session was checked, none when the check itself was the slow part
    (base.html then shows the links alone)."""
    scope, secret = getattr(request.state, "scope", None), getattr(request.state, "secret", None)
    return {"line": line, "scope": scope, "csrf": auth.csrf_for(secret) if secret else None}


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
        return templates.TemplateResponse(request, "slow.html", page_frame(request, line), 503)
    return PlainTextResponse(line, status_code=503)
