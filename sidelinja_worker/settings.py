"""Every setting of sidelinja-worker in one typed object.

Each field carries its environment variable, its default, its flag (if it has one) and the
commands that take it; the CLI builds its flags from these fields, the engine receives the values
built here (WorkerSettings, ServiceConfig), and the configuration table in docs/operations.md is
printed by `python -m sidelinja_worker.settings --markdown` (a test keeps the two equal).

One rule per kind of value: booleans take 1/0, true/false, yes/no, on/off (any case); durations
take a unit (queue/durations.py); an empty environment variable counts as unset. Secrets have no
flag (a command line shows in `ps` and shell history): they come from their variable or from a
file named by NAME_FILE, and never print.
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field, SecretStr, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from sidelinja_worker.admin.gate import READ_TIMEOUT_S, REQUEST_ARRIVAL_S
from sidelinja_worker.queue.config import ServiceConfig
from sidelinja_worker.queue.durations import parse_duration_s
from sidelinja_worker.queue.errors import UserError
from sidelinja_worker.queue.escapes import printable
from sidelinja_worker.queue.metrics import DEFAULT_HOST as DEFAULT_METRICS_HOST
from sidelinja_worker.queue.settings import WorkerSettings

GLOBAL = "global"  # every command
SERVICE_COMMANDS = ("run", "demo")


@dataclass(frozen=True)
class Meta:
    """What the CLI and the docs need to know about a field besides its type."""

    env: str
    commands: tuple[str, ...]
    help: str
    default_text: str
    flag: str | None = None  # None: no flag (secrets, or settings only an env var sets)
    secret: bool = False
    section: str = "worker"


TRUE = frozenset({"1", "true", "yes", "on"})
FALSE = frozenset({"0", "false", "no", "off"})


def _duration(value: Any) -> float:
    if isinstance(value, int | float):  # a default, already in seconds
        return float(value)
    try:
        return parse_duration_s(str(value))
    except UserError as exc:
        raise ValueError(str(exc)) from None


def _whole(value: Any) -> int:
    if isinstance(value, int):
        return value
    text = str(value).strip()
    if not text.isdigit():
        raise ValueError(f"{value!r} is not a whole number")
    return int(text)


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in TRUE:
        return True
    if text in FALSE:
        return False
    raise ValueError(f"{value!r} is not on/off, true/false, yes/no or 1/0")


def _choice(*choices: str) -> Any:
    def check(value: str | None) -> str | None:
        if value is None:
            return None
        if value.lower() not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}, not {value!r}")
        return value.lower()

    return AfterValidator(check)


def _stripped(value: Any) -> Any:
    """A text value without the whitespace around it (None if nothing is left): a URL pasted
    with a leading space connects, so it must also be read as a URL everywhere else."""
    if isinstance(value, str):
        return value.strip() or None
    return value


Duration = Annotated[float, BeforeValidator(_duration)]
Flag = Annotated[bool, BeforeValidator(_bool)]
Whole = Annotated[int, BeforeValidator(_whole)]


def _field(
    default: Any,
    env: str,
    help: str,
    default_text: str,
    *,
    commands: tuple[str, ...] = ("run",),
    flag: str | None = "",
    secret: bool = False,
    section: str = "worker",
) -> Any:
    """A setting; `flag` "" derives the flag from the field name, None means no flag."""
    meta = Meta(env, commands, help, default_text, flag, secret, section)
    return Field(default, validation_alias=env, json_schema_extra={"meta": meta})  # type: ignore[dict-item]


# The most a secret file holds: a URL or a token is far smaller; a bigger file is not a secret.
SECRET_FILE_MAX_BYTES = 64 * 1024


def read_secret(variable: str, path: str) -> str:
    """The text of the secret file `path`, named by `variable`, or a UserError. Every command
    loads every secret, so a file that is not one must not stop an unrelated command with a
    traceback or a hang: only a regular file is read (a FIFO blocked `jobs list` for ever; it
    is opened without blocking to be looked at), at most SECRET_FILE_MAX_BYTES of it, as UTF-8."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise UserError(f"{variable}: cannot read {printable(path)}: {exc.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UserError(f"{variable}: {printable(path)} is not a regular file")
        data = os.read(fd, SECRET_FILE_MAX_BYTES + 1)
    except OSError as exc:
        raise UserError(f"{variable}: cannot read {printable(path)}: {exc.strerror}") from None
    finally:
        os.close(fd)
    if len(data) > SECRET_FILE_MAX_BYTES:
        raise UserError(
            f"{variable}: {printable(path)} is larger than {SECRET_FILE_MAX_BYTES} bytes"
        )
    try:
        return data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise UserError(f"{variable}: {printable(path)} is not UTF-8 text") from None


class FileSecrets(PydanticBaseSettingsSource):
    """NAME_FILE=/path for every secret: the value is the file's content without the whitespace
    around it (a Kubernetes or Docker secret mounted as a file, written with a final newline or
    a blank first line). No token, key or URL starts or ends with whitespace; kept, a leading
    blank line hid a DATABASE_URL's scheme from `redact`, which then printed its password."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        meta = meta_of(field)
        path = os.environ.get(f"{meta.env}_FILE") if meta.secret else None
        if not path:
            return None, field_name, False
        if os.environ.get(meta.env):
            raise UserError(f"{meta.env} and {meta.env}_FILE are both set: keep one")
        return read_secret(f"{meta.env}_FILE", path), field_name, False

    def __call__(self) -> dict[str, Any]:
        values = {}
        for name, field in self.settings_cls.model_fields.items():
            value, _, _ = self.get_field_value(field, name)
            if value is not None:
                values[name] = value
        return values


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        case_sensitive=True,
        env_ignore_empty=True,
        extra="ignore",
        frozen=True,
        populate_by_name=True,
        validate_default=True,
    )

    # Every command
    database_url: Annotated[SecretStr | None, BeforeValidator(_stripped)] = _field(
        None,
        "DATABASE_URL",
        "the PostgreSQL to use (`postgresql://user:password@host:5432/db`)",
        "embedded",
        commands=(GLOBAL,),
        flag=None,
        secret=True,
    )
    data_dir: str | None = _field(
        None,
        "SIDELINJA_DATA_DIR",
        "folder of the embedded PostgreSQL (used when DATABASE_URL is unset)",
        "user data folder; `/var/lib/sidelinja-worker` as root",
        commands=(GLOBAL,),
    )
    debug: Flag = _field(
        False, "SIDELINJA_DEBUG", "tracebacks and debug logs", "off", commands=(GLOBAL,)
    )
    log_level: Annotated[str | None, _choice("debug", "info", "warning", "error")] = _field(
        None,
        "SIDELINJA_LOG_LEVEL",
        "`debug`, `info`, `warning` or `error`",
        "info; debug with --debug",
        commands=(GLOBAL,),
    )
    log_format: Annotated[str | None, _choice("json", "text")] = _field(
        None,
        "SIDELINJA_LOG_FORMAT",
        "`json` or `text` log lines",
        "json off a terminal, text on one",
        commands=(GLOBAL,),
    )

    # run
    max_concurrent: Whole = _field(
        3, "SIDELINJA_MAX_CONCURRENT", "handlers at once in this process", "3"
    )
    poll_interval: Duration = _field(
        1.0,
        "SIDELINJA_POLL_INTERVAL",
        "poll this often (LISTEN/NOTIFY wakes the worker sooner)",
        "1s",
    )
    types: str = _field(
        "",
        "SIDELINJA_TYPES",
        "comma-separated job types this process runs; an unknown name is an error",
        "all",
    )
    burst: Flag = _field(False, "SIDELINJA_BURST", "exit 0 once no due job is left", "off")
    lease: Duration = _field(
        60.0,
        "SIDELINJA_LEASE",
        "a dead worker's jobs are back in the queue within this plus one poll (1s to 1d)",
        "60s",
    )
    grace: Duration = _field(
        30.0, "SIDELINJA_GRACE", "on SIGTERM/SIGINT, wait this long for running jobs", "30s"
    )
    no_listen: Flag = _field(
        False,
        "SIDELINJA_NO_LISTEN",
        "poll only, no LISTEN (for a pooler that does not keep a session)",
        "off",
    )
    max_timeout: Duration = _field(
        6 * 3600.0, "SIDELINJA_MAX_TIMEOUT", "cap on a job's `timeout_s` override", "6h"
    )
    keep_completed: Duration = _field(
        14 * 86400.0,
        "SIDELINJA_KEEP_COMPLETED",
        "completed and cancelled jobs are pruned after this",
        "14d",
    )
    keep_errors: Duration = _field(
        90 * 86400.0,
        "SIDELINJA_KEEP_ERRORS",
        "jobs that ended in `error` are pruned after this",
        "90d",
    )
    metrics_port: Whole | None = _field(
        None, "SIDELINJA_METRICS_PORT", "serve Prometheus `/metrics` on this port", "off"
    )
    metrics_bind: str = _field(
        DEFAULT_METRICS_HOST,
        "SIDELINJA_METRICS_BIND",
        "the address `/metrics` listens on (with --metrics-port)",
        "127.0.0.1",
    )

    # admin
    admin_bind: str = _field(
        "127.0.0.1:8080",
        "SIDELINJA_ADMIN_BIND",
        "HOST:PORT of the admin view",
        "127.0.0.1:8080",
        commands=("admin",),
        flag="--bind",
        section="admin",
    )
    admin_read_timeout: Duration = _field(
        READ_TIMEOUT_S,
        "SIDELINJA_ADMIN_READ_TIMEOUT",
        "a page's queries give up after this, each and together, with a 503 asking for a narrower"
        " filter (100ms to 1h)",
        f"{READ_TIMEOUT_S:g}s",
        commands=("admin",),
        flag="--read-timeout",
        section="admin",
    )
    admin_request_timeout: Duration = _field(
        REQUEST_ARRIVAL_S,
        "SIDELINJA_ADMIN_REQUEST_TIMEOUT",
        "a request's head and body must arrive within this, or its connection is closed (100ms to 1h)",
        f"{REQUEST_ARRIVAL_S:g}s",
        commands=("admin",),
        flag="--request-timeout",
        section="admin",
    )
    spacetimedb_url: str | None = _field(
        None,
        "SPACETIMEDB_URL",
        "forward job events to this SpacetimeDB",
        "off",
        commands=("admin",),
        section="admin",
    )
    spacetimedb_database: str | None = _field(
        None,
        "SPACETIMEDB_DATABASE",
        "its database name or identity (needed with SPACETIMEDB_URL)",
        "-",
        commands=("admin",),
        section="admin",
    )
    spacetimedb_reducer: str = _field(
        "job_event",
        "SPACETIMEDB_REDUCER",
        "the reducer called with each event's JSON",
        "job_event",
        commands=("admin",),
        section="admin",
    )
    spacetimedb_token: SecretStr | None = _field(
        None,
        "SPACETIMEDB_TOKEN",
        "its bearer token",
        "none",
        commands=("admin",),
        flag=None,
        secret=True,
        section="admin",
    )

    # Outside services (run and demo); a job whose service is unset fails at once naming it.
    whisper_url: str | None = _field(
        None,
        "WHISPER_URL",
        "faster-whisper-server / speaches base URL",
        "-",
        commands=SERVICE_COMMANDS,
        section="services",
    )
    whisper_governed_url: str | None = _field(
        None,
        "WHISPER_GOVERNED_URL",
        "low-thread whisper used while a LiveKit room is live",
        "-",
        commands=SERVICE_COMMANDS,
        section="services",
    )
    whisper_model: str | None = _field(
        None,
        "WHISPER_MODEL",
        "whisper model id",
        "`Systran/faster-whisper-large-v3`",
        commands=SERVICE_COMMANDS,
        section="services",
    )
    whisper_api_key: SecretStr | None = _field(
        None,
        "WHISPER_API_KEY",
        "API key of the whisper servers, if they need one",
        "-",
        commands=SERVICE_COMMANDS,
        flag=None,
        secret=True,
        section="services",
    )
    media_root: str | None = _field(
        None,
        "MEDIA_ROOT",
        "folder that audio and log paths in payloads are confined to",
        "-",
        commands=SERVICE_COMMANDS,
        section="services",
    )
    forgejo_url: str | None = _field(
        None,
        "FORGEJO_URL",
        "Forgejo base URL (transcripts are committed there)",
        "-",
        commands=SERVICE_COMMANDS,
        section="services",
    )
    forgejo_token: SecretStr | None = _field(
        None,
        "FORGEJO_TOKEN",
        "Forgejo access token (write:repository)",
        "-",
        commands=SERVICE_COMMANDS,
        flag=None,
        secret=True,
        section="services",
    )
    ai_gateway_url: str | None = _field(
        None,
        "AI_GATEWAY_URL",
        "OpenAI-compatible gateway, e.g. `https://openrouter.ai/api/v1`",
        "-",
        commands=SERVICE_COMMANDS,
        section="services",
    )
    ai_gateway_key: SecretStr | None = _field(
        None,
        "AI_GATEWAY_KEY",
        "AI gateway API key",
        "-",
        commands=SERVICE_COMMANDS,
        flag=None,
        secret=True,
        section="services",
    )
    livekit_url: str | None = _field(
        None,
        "LIVEKIT_URL",
        "LiveKit server URL (the resource governor)",
        "off",
        commands=SERVICE_COMMANDS,
        section="services",
    )
    livekit_api_key: str | None = _field(
        None,
        "LIVEKIT_API_KEY",
        "LiveKit API key",
        "-",
        commands=SERVICE_COMMANDS,
        section="services",
    )
    livekit_api_secret: SecretStr | None = _field(
        None,
        "LIVEKIT_API_SECRET",
        "LiveKit API secret",
        "-",
        commands=SERVICE_COMMANDS,
        flag=None,
        secret=True,
        section="services",
    )
    geoip_db: str | None = _field(
        None,
        "GEOIP_DB",
        "MaxMind-format country database (`.mmdb`) for stats_parse",
        "off",
        commands=SERVICE_COMMANDS,
        section="services",
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Flags over environment variables over NAME_FILE; no .env file is read.
        return init_settings, env_settings, FileSecrets(settings_cls)

    # The values the engine receives

    def worker_settings(self, known_types: Iterable[str]) -> WorkerSettings:
        known = set(known_types)
        types = tuple(t.strip() for t in self.types.split(",") if t.strip())
        unknown = [t for t in types if t not in known]
        if unknown:
            raise UserError(
                f"unknown job types in --types: {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        return WorkerSettings(
            max_concurrent=self.max_concurrent,
            poll_interval_s=self.poll_interval,
            job_types=types,
            burst=self.burst,
            lease_s=self.lease,
            grace_s=self.grace,
            listen=not self.no_listen,
            max_timeout_s=self.max_timeout,
            keep_completed_s=self.keep_completed,
            keep_errors_s=self.keep_errors,
        )

    def service_config(self) -> ServiceConfig:
        values = {}
        for name, field in type(self).model_fields.items():
            meta = meta_of(field)
            value = getattr(self, name)
            if meta.section == "services" and value is not None:
                values[meta.env] = (
                    value.get_secret_value() if isinstance(value, SecretStr) else str(value)
                )
        return ServiceConfig(values)

    @property
    def database(self) -> str | None:
        return self.database_url.get_secret_value() if self.database_url else None

    @property
    def level(self) -> str:
        return (self.log_level or ("debug" if self.debug else "info")).upper()


# Bounds, checked after parsing; the message names the flag and its variable. The upper ones
# keep a value within what PostgreSQL's intervals and the event loop's timers take, and a lease
# short enough that a dead worker's jobs come back the same day.
DAY = 86400.0
CENTURY = 100 * 365 * DAY
_BOUNDS: dict[str, tuple[float, float, str]] = {
    "max_concurrent": (1, 10_000, "1 to 10000"),
    "lease": (1.0, DAY, "1s to 1d"),
    "poll_interval": (0.01, 3600.0, "10ms to 1h"),
    "grace": (0.0, CENTURY, "at most 36500d"),
    "max_timeout": (1.0, CENTURY, "1s to 36500d"),
    "keep_completed": (0.0, CENTURY, "at most 36500d"),
    "keep_errors": (0.0, CENTURY, "at most 36500d"),
    "metrics_port": (1, 65535, "a port, 1 to 65535"),
    "admin_read_timeout": (0.1, 3600.0, "100ms to 1h"),
    "admin_request_timeout": (0.1, 3600.0, "100ms to 1h"),
}


def meta_of(field: FieldInfo) -> Meta:
    extra = field.json_schema_extra
    assert isinstance(extra, dict)
    meta = extra["meta"]
    assert isinstance(meta, Meta)
    return meta


def fields() -> Iterator[tuple[str, Meta]]:
    for name, field in Settings.model_fields.items():
        yield name, meta_of(field)


def flag_of(name: str, meta: Meta) -> str | None:
    if meta.flag is None:
        return None
    return meta.flag or "--" + name.replace("_", "-")


def label(name: str) -> str:
    meta = meta_of(Settings.model_fields[name])
    flag = flag_of(name, meta)
    return f"{flag} / {meta.env}" if flag else meta.env


def load(flags: Mapping[str, Any] | None = None) -> Settings:
    """The settings from `flags` (field name -> the text given), the environment and NAME_FILE.
    A bad value is a UserError naming the flag and its variable; a secret's value never shows."""
    given = {k: v for k, v in (flags or {}).items() if v is not None}
    try:
        settings = Settings(**given)
    except ValidationError as exc:
        err = exc.errors()[0]
        name = str(err["loc"][0]) if err["loc"] else ""
        name = next((n for n, m in fields() if name in (n, m.env)), name)
        message = err["msg"].removeprefix("Value error, ")
        sep = " " if message.startswith("must") else ": "
        raise UserError(
            f"{label(name) if name in Settings.model_fields else name}{sep}{message}"
        ) from None
    for name, (low, high, text) in _BOUNDS.items():
        value = getattr(settings, name)
        if value is not None and not low <= value <= high:
            raise UserError(f"{label(name)} must be {text}")
    return settings


def add_flags(parser: argparse.ArgumentParser, command: str) -> None:
    """The flags of `command` (or GLOBAL). Unset flags stay absent, so the environment holds."""
    groups: dict[str, Any] = {}
    for name, meta in fields():
        flag = flag_of(name, meta)
        if command not in meta.commands or flag is None:
            continue
        if meta.section == "services" and "services" not in groups:
            groups["services"] = parser.add_argument_group(
                "outside services (secrets: env var or NAME_FILE only)"
            )
        target = groups.get(meta.section, parser)
        kind = Settings.model_fields[name].annotation
        default = "unset" if meta.default_text == "-" else meta.default_text
        help_text = f"{meta.help} [env {meta.env}] ({default})".replace("`", "")
        if kind is bool:
            target.add_argument(
                flag, dest=name, action="store_true", default=argparse.SUPPRESS, help=help_text
            )
        else:
            metavar = "DURATION" if kind is float else "N" if "int" in str(kind) else "VALUE"
            target.add_argument(
                flag, dest=name, metavar=metavar, default=argparse.SUPPRESS, help=help_text
            )


def given_flags(args: argparse.Namespace) -> dict[str, Any]:
    return {name: getattr(args, name) for name, _ in fields() if hasattr(args, name)}


SECTIONS = (
    ("worker", "Every command, and `run`"),
    ("admin", "The admin view (`admin`)"),
    ("services", "Outside services (`run` and `demo`)"),
)


def markdown() -> str:
    """The configuration table of docs/operations.md."""
    lines = []
    for section, title in SECTIONS:
        lines += [f"**{title}**", "", "| flag | env | default | meaning |", "|---|---|---|---|"]
        for name, meta in fields():
            if meta.section != section:
                continue
            flag = flag_of(name, meta)
            where = "" if GLOBAL in meta.commands or section != "worker" else "run "
            shown = f"`{where}{flag}`" if flag else "—"
            env = f"`{meta.env}`" + (f" or `{meta.env}_FILE`" if meta.secret else "")
            lines.append(f"| {shown} | {env} | {meta.default_text} | {meta.help} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:] != ["--markdown"]:
        print("usage: python -m sidelinja_worker.settings --markdown", file=sys.stderr)
        raise SystemExit(2)
    print(markdown(), end="")
