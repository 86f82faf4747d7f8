"""What the AI gateway's errors say, for a job's error_msg: the error object of an answer (or a
stand-in built from a body in another shape), described with the metadata that says what to fix.
Its Retry-After is read as every service's is (classify.retry_after_s) and believed up to
MAX_RETRY_AFTER_S."""

from __future__ import annotations

import reprlib
from collections.abc import Mapping
from typing import Any

import httpx

from sidelinja_worker.services import bounded, classify

# A Retry-After beyond this is not believed: the pause is cut to it.
MAX_RETRY_AFTER_S = 3600.0
MAX_MESSAGE_CHARS = 400


def retry_after_s(resp: httpx.Response) -> float | None:
    """The answer's Retry-After as every service's is read (classify.retry_after_s: an
    unsigned decimal or a date, else None), believed up to MAX_RETRY_AFTER_S."""
    seconds = classify.retry_after_s(resp)
    return None if seconds is None else min(seconds, MAX_RETRY_AFTER_S)


def error_object(resp: httpx.Response) -> dict[str, Any]:
    """`{"code", "message", "metadata"}` from the OpenRouter error shape, or a stand-in built
    from a body that is not (a proxy's HTML page, say)."""
    data = bounded.small_json(resp)  # an error body is small; a huge one is not parsed
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        return data["error"]
    if isinstance(data, dict) and isinstance(data.get("error"), str):
        return {"code": resp.status_code, "message": data["error"]}
    text = " ".join(bounded.text_start(resp)[:2000].split())[:200]
    return {"code": resp.status_code, "message": text or resp.reason_phrase}


def describe_error(code: Any, error: Mapping[str, Any]) -> str:
    """`AI gateway 402: message (limit_source: key)`: the gateway's words and the metadata that
    says what to fix, short enough for error_msg."""
    message = _text(error.get("message") or "no message")
    found = error.get("metadata")
    meta: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    details = [
        f"{k}: {_short(meta[k])}"
        for k in ("limit_source", "reasons", "provider_name", "provider_code", "model_slug")
        if meta.get(k) not in (None, "", [])
    ]
    suffix = f" ({'; '.join(details)})" if details else ""
    return f"AI gateway {code}: {message}{suffix}"[:MAX_MESSAGE_CHARS]


def _short(value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(_text(v) for v in value[:_SHOWN_ITEMS])
    return _text(value)


def _text(value: Any) -> str:
    """`value` as text no longer than a message: a string itself, anything else written out by
    reprlib, which stops after a few items and levels. A 200 answer may hold 16 MB, and its
    error written out whole, on the event loop, took 0.4-0.7 s to be cut to a message."""
    return (value if isinstance(value, str) else _BOUNDED.repr(value))[:MAX_MESSAGE_CHARS]


_SHOWN_ITEMS = 10
_BOUNDED = reprlib.Repr()
_BOUNDED.maxstring = _BOUNDED.maxother = MAX_MESSAGE_CHARS
