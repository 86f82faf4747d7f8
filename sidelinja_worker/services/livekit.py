"""LiveKit RoomService over Twirp JSON: which rooms are live. ListRooms only."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import httpx
import jwt

from sidelinja_worker.queue.config import Secret
from sidelinja_worker.queue.errors import PermanentError, RetryJob
from sidelinja_worker.services import bounded
from sidelinja_worker.services.classify import (
    detail,
    is_transient,
    transient_status,
    transport_failure,
)

SERVICE = "LiveKit"
TIMEOUT = httpx.Timeout(10.0)  # the SDK's default
DEADLINE_S = 15.0  # the whole exchange, however slowly the bytes come
MAX_ANSWER_BYTES = 4 * 1024 * 1024  # thousands of rooms
TOKEN_TTL_S = 600
CACHE_S = 5.0  # many transcription jobs starting together ask LiveKit once


@dataclass(frozen=True)
class Room:
    name: str
    num_participants: int


@dataclass(frozen=True)
class LiveKitServer:
    url: str
    api_key: str
    api_secret: Secret

    @property
    def http_url(self) -> str:
        # The SDK accepts the ws(s):// URL clients use and rewrites it; so do we.
        url = self.url.rstrip("/")
        for ws, http in (("wss://", "https://"), ("ws://", "http://")):
            if url.startswith(ws):
                return http + url[len(ws) :]
        return url


# (url, api key) -> (monotonic time fetched, rooms). Per process: every job shares the answer.
_cache: dict[tuple[str, str], tuple[float, tuple[Room, ...]]] = {}


def clear_cache() -> None:
    _cache.clear()


def room_list_token(server: LiveKitServer, now_s: float | None = None) -> str:
    """An HS256 JWT with the `roomList` grant, signed with the API secret as the SDK does."""
    now = int(now_s if now_s is not None else time.time())
    claims = {
        "iss": server.api_key,
        "sub": "sidelinja-worker",
        "nbf": now,
        "exp": now + TOKEN_TTL_S,
        "video": {"roomList": True},
    }
    return jwt.encode(claims, server.api_secret.reveal(), algorithm="HS256")


async def list_rooms(http: httpx.AsyncClient, server: LiveKitServer) -> tuple[Room, ...]:
    """The active rooms, from a cache at most CACHE_S old. Two jobs missing the cache at once
    both ask: harmless, and no lock to tie to one event loop."""
    key = (server.http_url, server.api_key)
    hit = _cache.get(key)
    if hit is not None and time.monotonic() - hit[0] < CACHE_S:
        return hit[1]
    rooms = await _fetch(http, server)
    _cache[key] = (time.monotonic(), rooms)
    return rooms


async def _fetch(http: httpx.AsyncClient, server: LiveKitServer) -> tuple[Room, ...]:
    url = server.http_url + "/twirp/livekit.RoomService/ListRooms"
    headers = {"Authorization": f"Bearer {room_list_token(server)}"}
    try:
        response = await bounded.send(
            http,
            "POST",
            url,
            service=SERVICE,
            max_bytes=MAX_ANSWER_BYTES,
            deadline_s=DEADLINE_S,
            json={},
            headers=headers,
            timeout=TIMEOUT,
        )
    except httpx.TransportError as exc:
        raise transport_failure(SERVICE, exc) from None
    if response.status_code != 200:
        raise _error(response, server)
    try:
        # 4 MB holds 1.39 million empty rooms: made Rooms on the event loop, 1.0 s.
        return await bounded.off_loop(_rooms, response.content)
    except (ValueError, TypeError, AttributeError, OverflowError):  # 1e999 participants: inf
        raise RetryJob(f"{SERVICE} answered 200 with a room list that cannot be read") from None


def _rooms(content: bytes) -> tuple[Room, ...]:
    rooms = bounded.loads(content).get("rooms") or ()
    return tuple(_room(r) for r in rooms)


def _room(raw: dict[str, Any]) -> Room:
    # Twirp's protojson may use proto names or camelCase and omits zero values.
    count = raw.get("num_participants", raw.get("numParticipants", 0))
    return Room(name=str(raw.get("name", "")), num_participants=int(count or 0))


def _error(response: httpx.Response, server: LiveKitServer) -> Exception:
    """Twirp errors: {"code", "msg"}. 5xx and 429 transient; 4xx (unauthenticated, bad route,
    permission_denied) is configuration that will not fix itself."""
    message = detail(response, ("msg", "code"), [server.api_secret.reveal()])
    if is_transient(response.status_code):
        return transient_status(SERVICE, response, message)
    hint = ""
    if response.status_code in (401, 403):
        hint = " (check LIVEKIT_API_KEY and LIVEKIT_API_SECRET)"
    return PermanentError(f"{SERVICE} answered {response.status_code}: {message}{hint}")
