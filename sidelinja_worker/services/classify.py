"""Shared by the service clients: HTTP answers and transport faults turned into job outcomes."""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import httpx

from sidelinja_worker.queue.backoff import RETRY_MAX_S, clamp_s
from sidelinja_worker.queue.errors import PermanentError, RetryJob
from sidelinja_worker.services import bounded

MAX_DETAIL_CHARS = 300


def retry_after_s(response: httpx.Response) -> float | None:
    """Retry-After as seconds (delta or HTTP date), None when absent or unreadable. A date is
    read against the answer's own Date header when it has a readable one: both are the
    service's clock, so neither its error nor this machine's counts (a service two days behind
    asked for two minutes and got none); without one, against this machine's clock."""
    return parse_retry_after(response.headers.get("retry-after"), _sent_at(response))


def _sent_at(response: httpx.Response) -> datetime | None:
    """The answer's Date header, aware, or None when absent or unreadable."""
    value = response.headers.get("date")
    if not value:
        return None
    try:
        when = parsedate_to_datetime(value.strip())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


# A delta is 1*DIGIT (RFC 9110 §10.2.3); a fraction is tolerated, signs and exponents are not.
_DELTA = re.compile(r"[0-9]+(?:\.[0-9]+)?")


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """A Retry-After value as seconds in [0, RETRY_MAX_S] (6 h: a retry is never scheduled
    further out, whatever a service asks), or None when absent or unreadable (NaN, a sign, an
    exponent, garbage), which leaves the job to the worker's backoff. A date in the past is 0.
    Never raises: the header comes from outside."""
    if not value:
        return None
    text = value.strip()
    if _DELTA.fullmatch(text):
        return min(float(text), RETRY_MAX_S)
    try:
        when = parsedate_to_datetime(text)
        if when.tzinfo is None:  # "-0000": the RFC's way of saying UTC with no zone known
            when = when.replace(tzinfo=UTC)
        seconds = (when - (now or datetime.now(UTC))).total_seconds()
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return clamp_s(seconds, RETRY_MAX_S)


def detail(response: httpx.Response, keys: Iterable[str], secrets: Iterable[str] = ()) -> str:
    """The service's own error message (first of `keys` in a small JSON body, else the start of
    the text), short, with any secret value blanked in case a service echoes what it was sent."""
    body = bounded.small_json(response)
    found = [str(body[k]) for k in keys if body.get(k)] if isinstance(body, dict) else []
    text = found[0] if found else bounded.text_start(response)
    return scrub(" ".join(text.split())[:MAX_DETAIL_CHARS], secrets)


# A run of the characters tokens and keys are made of. A message is cut to its length (and a
# long value inside it by reprlib, which keeps both ends) wherever the cut falls, so a secret
# a service echoed can arrive cut in pieces: each piece is such a run, bounded by the cut.
_TOKEN_RUN = re.compile(r"[A-Za-z0-9_-]{6,}")


def scrub(text: str, secrets: Iterable[str]) -> str:
    """`text` with each secret blanked, and each piece of one a cut left (any run of six or
    more token characters found inside a secret): blanking whole secrets only, a token that
    straddled the message's cut left its first 19 of 40 characters in error_msg."""
    kept = [secret for secret in secrets if secret]
    for secret in kept:
        text = text.replace(secret, "***")
    if not kept:
        return text
    return _TOKEN_RUN.sub(
        lambda m: "***" if any(m.group() in secret for secret in kept) else m.group(), text
    )


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
