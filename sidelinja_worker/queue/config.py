"""The outside services' settings as the engine receives them; secrets are wrapped so they
never print."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

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


# The outside services' variables. The settings object (sidelinja_worker/settings.py) owns
# their flags, help and parsing; this list lets a Worker built in Python read them alone.
SERVICE_ENV: tuple[str, ...] = (
    "WHISPER_URL",
    "WHISPER_GOVERNED_URL",
    "WHISPER_MODEL",
    "WHISPER_API_KEY",
    "MEDIA_ROOT",
    "FORGEJO_URL",
    "FORGEJO_TOKEN",
    "AI_GATEWAY_URL",
    "AI_GATEWAY_KEY",
    "LIVEKIT_URL",
    "LIVEKIT_API_KEY",
    "LIVEKIT_API_SECRET",
    "GEOIP_DB",
)


@dataclass(frozen=True)
class ServiceConfig:
    """The outside-service settings in force; `get` is None when unset."""

    values: Mapping[str, str]

    @classmethod
    def from_env(cls) -> ServiceConfig:
        """The services named in the environment, for a Worker built without the CLI (which
        passes the settings object's values instead)."""
        values = {}
        for name in SERVICE_ENV:
            value = os.environ.get(name)
            path = os.environ.get(f"{name}_FILE")
            if not value and path:
                value = Path(path).read_text(encoding="utf-8").rstrip("\r\n")
            if value:
                values[name] = value
        return cls(values)

    def get(self, env: str) -> str | None:
        return self.values.get(env)

    def require(self, env: str) -> str:
        """The value, or a PermanentError naming the variable: the job fails at once."""
        value = self.values.get(env)
        if not value:
            raise PermanentError(
                f"{env} is not set: set it in the worker's environment to run this job type"
            )
        return value

    def secret(self, env: str) -> Secret:
        return Secret(self.require(env))

    def missing(self, names: tuple[str, ...]) -> list[str]:
        return [n for n in names if not self.values.get(n)]
