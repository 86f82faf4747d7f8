"""Tokens and sessions (made, hashed, checked), cross-site request checks, and the security
headers.

A request presents either a token (`Authorization: Bearer`, for scripts) or a session (the
cookie a login sets, for browsers). A session is its own random secret, never the token, and
ends SESSION_LIFETIME_S after login however active it is, at logout, or when its token is
revoked."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from urllib.parse import urlencode, urlsplit

import asyncpg
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Send
from starlette.types import Scope as AsgiScope

from sidelinja_worker.admin import store
from sidelinja_worker.admin.store import Scope

COOKIE = "sidelinja_admin"
TOKEN_PREFIX = "slj_"
SESSION_LIFETIME_S = 8 * 3600  # a working day; fixed from login, not extended by use
# The login form is read before anything is checked, by anyone: a token (47 characters) and
# room to spare, no file; Starlette's own bounds (1,000 fields of 1 MB, 1,000 files of any size)
# let one request hold a gigabyte.
LOGIN_FIELD_MAX = 4096
LOGIN_FIELDS_MAX = 8
LOGIN_BODY_MAX = 2 * LOGIN_FIELD_MAX  # a token, where to land, and the form's separators

# Pages may not be framed (clickjacking), run only our own script, and leak no URLs.
HEADERS = [
    (b"x-frame-options", b"DENY"),
    (
        b"content-security-policy",
        (
            b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
            b"frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
        ),
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
]


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def digest(token: str) -> bytes:
    """SHA-256 is enough: tokens are 256 random bits, not passwords that need stretching."""
    return hashlib.sha256(token.encode()).digest()


def new_session_secret() -> str:
    return secrets.token_urlsafe(32)


def csrf_for(credential: str) -> str:
    """Derived from the session secret (or token), so no server state; a cross-site page
    cannot read it."""
    return hmac.new(digest(credential), b"csrf", hashlib.sha256).hexdigest()


@dataclass(frozen=True, slots=True)
class Credential:
    """What a request presented: a token (bearer) or a session secret (cookie)."""

    secret: str
    is_session: bool


def presented(request: Request) -> Credential | None:
    header = request.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return Credential(header[7:].strip(), is_session=False)
    cookie = request.cookies.get(COOKIE)
    return Credential(cookie, is_session=True) if cookie else None


async def scope_of(pool: asyncpg.Pool, token: str | None) -> Scope | None:
    if not token:
        return None
    return await store.lookup_token(pool, digest(token))


async def scope_for(pool: asyncpg.Pool, credential: Credential | None) -> Scope | None:
    """The scope of a live token or a live session; None for anything else."""
    if credential is None or not credential.secret:
        return None
    if credential.is_session:
        return await store.lookup_session(pool, digest(credential.secret))
    return await store.lookup_token(pool, digest(credential.secret))


def same_origin(request: Request) -> bool:
    """False for a request a browser says came from another site or origin: an Origin that is
    not ours, or Sec-Fetch-Site other than same-origin (or none: typed by the user). A client
    that sends neither header is no browser, and cross-site requests come from browsers."""
    origin = request.headers.get("origin")
    if origin and origin != f"{request.url.scheme}://{request.url.netloc}":
        return False
    return request.headers.get("sec-fetch-site", "same-origin") in ("same-origin", "none")


def csrf_ok(request: Request, credential: str, sent: str | None) -> bool:
    """The form's CSRF value must match, and the request must not come from another site."""
    if not same_origin(request):
        return False
    return sent is not None and hmac.compare_digest(sent, csrf_for(credential))


LANDING = "/admin/jobs"  # where a login goes when it was asked for no page of the view


def login_url(request: Request) -> str:
    """The login page, naming the page the browser asked for: after the login it goes there,
    not to the job list (a job's link sent in a chat, opened logged out, was lost)."""
    asked = _page_asked(request)
    return "/admin/login" if asked == LANDING else f"/admin/login?{urlencode({'next': asked})}"


def _page_asked(request: Request) -> str:
    """The page a request asked for; for a form posted from a page of this view (an action
    whose session ran out meanwhile), that page: the action's own URL, loaded after the
    login, was a 405 ("No such job" for a bulk retry)."""
    if request.method in ("GET", "HEAD"):
        return request.url.path + (f"?{request.url.query}" if request.url.query else "")
    sent_from = urlsplit(request.headers.get("referer", ""))
    if f"{sent_from.scheme}://{sent_from.netloc}" != f"{request.url.scheme}://{request.url.netloc}":
        return LANDING
    return sent_from.path + (f"?{sent_from.query}" if sent_from.query else "")


def landing(asked: str) -> str:
    """`asked` if it is a page of this view (a path under /admin, on this host), LANDING
    otherwise: the login page takes it from its URL, which anyone may make, and must send no
    one elsewhere (//host, a scheme, a backslash that browsers read as a slash)."""
    parts = urlsplit(asked)
    ours = not parts.scheme and not parts.netloc and "\\" not in asked
    if ours and (parts.path == "/admin" or parts.path.startswith("/admin/")):
        return asked if not parts.path.startswith("/admin/login") else LANDING
    return LANDING


def is_browser_navigation(request: Request) -> bool:
    """A page load in a browser, which is sent to the login page when it lacks a session; any
    other request (a script, fetch, an API client) gets 401. Browsers say so with
    Sec-Fetch-Mode: navigate; without Sec-Fetch headers (older browsers), an Accept naming
    text/html counts. A request with an Authorization header is a script's."""
    if request.headers.get("authorization"):
        return False
    mode = request.headers.get("sec-fetch-mode")
    if mode is not None:
        return mode == "navigate"
    return "text/html" in request.headers.get("accept", "")


class SecurityHeaders:
    """Adds HEADERS to every response (plain ASGI: it must not buffer the SSE stream)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = list(message.get("headers", [])) + HEADERS
            await send(message)

        await self.app(scope, receive, with_headers if scope["type"] == "http" else send)
