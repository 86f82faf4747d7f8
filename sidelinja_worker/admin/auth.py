"""Tokens (made, hashed, checked), the CSRF value of a session, and the security headers."""

from __future__ import annotations

import hashlib
import hmac
import secrets

import asyncpg
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Send
from starlette.types import Scope as AsgiScope

from sidelinja_worker.admin import store
from sidelinja_worker.admin.store import Scope

COOKIE = "sidelinja_admin"
TOKEN_PREFIX = "slj_"

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


def csrf_for(token: str) -> str:
    """Derived from the session token, so no server state; a cross-site page cannot read it."""
    return hmac.new(digest(token), b"csrf", hashlib.sha256).hexdigest()


def presented_token(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip()
    return request.cookies.get(COOKIE)


async def scope_of(pool: asyncpg.Pool, token: str | None) -> Scope | None:
    if not token:
        return None
    return await store.lookup_token(pool, digest(token))


def csrf_ok(request: Request, token: str, sent: str | None) -> bool:
    """The form's CSRF value must match, and a browser's Origin (when sent) must be ours."""
    origin = request.headers.get("origin")
    if origin and origin != f"{request.url.scheme}://{request.url.netloc}":
        return False
    return sent is not None and hmac.compare_digest(sent, csrf_for(token))


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
