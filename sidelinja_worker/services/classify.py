"""Shared by the service clients: HTTP answers and transport faults turned into job outcomes."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import httpx

from sidelinja_worker.queue.errors import PermanentError, RetryJob

MAX_DETAIL_CHARS = 300


def retry_after_s(response: httpx.Response) -> float | None:
    """Retry-After as seconds (delta or HTTP date), None when absent or unreadable."""
    value = response.headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, (parsedate_to_datetime(value) - datetime.now(UTC)).total_seconds())
    except (TypeError, ValueError):
        return None


def detail(response: httpx.Response, keys: Iterable[str], secrets: Iterable[str] = ()) -> str:
    """The service's own error message (first of `keys` in a JSON body, else the text), short,
    with any secret value blanked in case a service echoes what it was sent."""
    text = response.text
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        text = next((str(body[k]) for k in keys if body.get(k)), text)
    return scrub(" ".join(text.split())[:MAX_DETAIL_CHARS], secrets)


def scrub(text: str, secrets: Iterable[str]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


def transient_status(service: str, response: httpx.Response, message: str) -> RetryJob:
    return RetryJob(
        f"{service} answered {response.status_code}: {message}", after_s=retry_after_s(response)
    )


def permanent_status(service: str, response: httpx.Response, message: str) -> PermanentError:
    return PermanentError(f"{service} answered {response.status_code}: {message}")


def transport_failure(service: str, exc: httpx.TransportError) -> RetryJob:
    """A timeout or a lost connection: worth another attempt. The exception's text names the
    failure, never a header, so no token leaks through it."""
    kind = "timed out" if isinstance(exc, httpx.TimeoutException) else "unreachable"
    return RetryJob(f"{service} {kind}: {type(exc).__name__}: {exc}".rstrip(": "))


def is_transient(status: int) -> bool:
    return status == 429 or status >= 500
