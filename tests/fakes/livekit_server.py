"""A LiveKit server stand-in: Twirp `POST /twirp/livekit.RoomService/ListRooms`.
It verifies the HS256 JWT (signature with the API secret, `iss` = API key, nbf/exp, the
`video.roomList` grant) and answers Twirp errors {"code", "msg"}: 401 unauthenticated, 403
permission_denied, 404 bad_route for a non-JSON body, and any status on demand."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import jwt
from aiohttp import web

ROUTE = "/twirp/livekit.RoomService/ListRooms"


@dataclass
class FakeLiveKit:
    api_key: str
    api_secret: str
    rooms: list[dict[str, Any]] = field(default_factory=list)  # {"name", "num_participants"}
    fail_next: list[int] = field(default_factory=list)
    calls: int = 0
    claims: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""  # set once it is serving

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post(ROUTE, self.list_rooms)
        return app

    async def list_rooms(self, request: web.Request) -> web.Response:
        self.calls += 1
        if not request.content_type.startswith("application/json"):
            return _twirp(404, "bad_route", "unexpected Content-Type")
        claims = self._verify(request.headers.get("Authorization", ""))
        if isinstance(claims, web.Response):
            return claims
        self.claims.append(claims)
        if not (claims.get("video") or {}).get("roomList"):
            return _twirp(403, "permission_denied", "permissions denied")
        if self.fail_next:
            return _twirp(self.fail_next.pop(0), "unavailable", "server is draining")
        if not isinstance(await request.json(), dict):
            return _twirp(400, "malformed", "body is not a ListRoomsRequest")
        return web.json_response({"rooms": [_room(r) for r in self.rooms]})

    def _verify(self, header: str) -> dict[str, Any] | web.Response:
        prefix, _, token = header.partition(" ")
        if prefix != "Bearer" or not token:
            return _twirp(401, "unauthenticated", "no authorization header")
        try:
            claims = jwt.decode(
                token,
                self.api_secret,
                algorithms=["HS256"],
                options={"require": ["iss", "exp", "nbf"]},
            )
        except jwt.PyJWTError as exc:
            return _twirp(401, "unauthenticated", f"invalid token: {type(exc).__name__}")
        if claims["iss"] != self.api_key:
            return _twirp(401, "unauthenticated", "unknown API key")
        return claims


def _room(room: dict[str, Any]) -> dict[str, Any]:
    """As Twirp's protojson writes a Room: proto field names, zero values left out."""
    full = {
        "sid": f"RM_{room['name']}",
        "name": room["name"],
        "empty_timeout": 300,
        "num_participants": room.get("num_participants", 0),
        "num_publishers": room.get("num_publishers", 0),
        "creation_time": "1767225600",
    }
    return {k: v for k, v in full.items() if v}


def _twirp(status: int, code: str, msg: str) -> web.Response:
    return web.json_response({"code": code, "msg": msg, "meta": {}}, status=status)
