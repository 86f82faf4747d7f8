"""The resource governor: which whisper a transcription may use right now.

whisper takes its thread count per server, not per request, so while a LiveKit room is live a
transcription goes to the low-thread WHISPER_GOVERNED_URL, or waits (a deferral, not an attempt)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import httpx

from sidelinja_worker.queue.config import ServiceConfig
from sidelinja_worker.queue.errors import Defer, RetryJob
from sidelinja_worker.services import livekit

log = logging.getLogger("sidelinja_worker.governor")

RECHECK_S = 60.0


@dataclass(frozen=True)
class Route:
    url: str
    governed: bool
    reason: str
    live_rooms: int | None  # None: LiveKit not asked (not configured) or not answering

    def record(self) -> dict[str, Any]:
        """For the job's result: the decision, never the URL (it may carry credentials)."""
        return {
            "whisper": "governed" if self.governed else "default",
            "reason": self.reason,
            "live_rooms": self.live_rooms,
        }


def livekit_server(config: ServiceConfig) -> livekit.LiveKitServer | None:
    """None when LIVEKIT_URL is unset (no governor); a half configuration fails naming the gap."""
    url = config.get("LIVEKIT_URL")
    if not url:
        return None
    return livekit.LiveKitServer(
        url, config.require("LIVEKIT_API_KEY"), config.secret("LIVEKIT_API_SECRET")
    )


async def choose_whisper(http: httpx.AsyncClient, config: ServiceConfig) -> Route:
    """The whisper URL to use, or Defer while a room is live and no governed whisper exists."""
    default = config.require("WHISPER_URL")
    governed = config.get("WHISPER_GOVERNED_URL")
    server = livekit_server(config)
    if server is None:
        return Route(default, False, "no LiveKit configured: not governed", None)
    try:
        rooms = await livekit.list_rooms(http, server)
    except RetryJob as exc:
        if not governed:
            raise
        # Cannot tell whether a room is live; the governed whisper is safe either way.
        return Route(governed, True, f"LiveKit not answering ({exc}): governed whisper", None)
    live = [r.name for r in rooms if r.num_participants > 0]
    if not live:
        return Route(default, False, "no LiveKit room has participants", 0)
    names = ", ".join(live[:3]) + (", …" if len(live) > 3 else "")
    if governed:
        return Route(
            governed,
            True,
            f"{len(live)} live LiveKit room(s) ({names}): using WHISPER_GOVERNED_URL",
            len(live),
        )
    raise Defer(
        f"{len(live)} live LiveKit room(s) ({names}) and no WHISPER_GOVERNED_URL: "
        f"transcription waits, re-checked in {RECHECK_S:.0f} s",
        after_s=RECHECK_S,
    )
