"""Outside-service settings (DESIGN.md §6): each is an env var and a `run` flag; secrets are
wrapped so they never print."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from sidelinja_worker.queue.errors import PermanentError


class Secret:
    """A value that prints as *** in logs, errors, reprs and results."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__


@dataclass(frozen=True)
class Setting:
    env: str
    help: str
    secret: bool = False

    @property
    def flag(self) -> str:
        return "--" + self.env.lower().replace("_", "-")


SETTINGS: tuple[Setting, ...] = (
    Setting("WHISPER_URL", "faster-whisper-server / speaches base URL"),
    Setting(
        "WHISPER_GOVERNED_URL", "low-thread whisper instance used while a LiveKit room is live"
    ),
    Setting("WHISPER_MODEL", "whisper model id (default Systran/faster-whisper-large-v3)"),
    Setting("MEDIA_ROOT", "folder that audio and log paths in payloads are confined to"),
    Setting("FORGEJO_URL", "Forgejo base URL (transcripts are committed there)"),
    Setting("FORGEJO_TOKEN", "Forgejo access token (write:repository)", secret=True),
    Setting(
        "AI_GATEWAY_URL", "OpenAI-compatible gateway base URL, e.g. https://openrouter.ai/api/v1"
    ),
    Setting("AI_GATEWAY_KEY", "AI gateway API key", secret=True),
    Setting("LIVEKIT_URL", "LiveKit server URL (resource governor)"),
    Setting("LIVEKIT_API_KEY", "LiveKit API key"),
    Setting("LIVEKIT_API_SECRET", "LiveKit API secret", secret=True),
    Setting("SPACETIMEDB_URL", "SpacetimeDB URL for live status events (optional)"),
    Setting("WHISPER_API_KEY", "API key of the whisper servers, if they require one", secret=True),
    Setting("GEOIP_DB", "MaxMind-format country database (.mmdb) for stats_parse (optional)"),
)


@dataclass(frozen=True)
class ServiceConfig:
    """The outside-service settings in force; `get` is None when unset."""

    values: Mapping[str, str]

    @classmethod
    def from_env(cls, overrides: Mapping[str, str | None] | None = None) -> ServiceConfig:
        values = {s.env: os.environ[s.env] for s in SETTINGS if os.environ.get(s.env)}
        values.update({k: v for k, v in (overrides or {}).items() if v})
        return cls(values)

    def get(self, env: str) -> str | None:
        return self.values.get(env)

    def require(self, env: str) -> str:
        """The value, or a PermanentError naming the variable: the job fails at once."""
        value = self.values.get(env)
        if not value:
            raise PermanentError(
                f"{env} is not set: configure it (env var or --"
                f"{env.lower().replace('_', '-')}) to run this job type"
            )
        return value

    def secret(self, env: str) -> Secret:
        return Secret(self.require(env))

    def missing(self, names: tuple[str, ...]) -> list[str]:
        return [n for n in names if not self.values.get(n)]
