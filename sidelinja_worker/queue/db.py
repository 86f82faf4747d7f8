"""Connections: which database, and asyncpg pools set up the way every query here expects."""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias
from urllib.parse import urlsplit

import asyncpg
import orjson

from sidelinja_worker.queue import jsonvalues
from sidelinja_worker.queue.embedded import default_data_dir, start_embedded
from sidelinja_worker.queue.errors import UserError
from sidelinja_worker.queue.escapes import printable

# What runs a query: a connection, or a pool that lends one for the call.
Conn: TypeAlias = asyncpg.Connection | asyncpg.Pool

# What a lost, restarted, overloaded or momentarily unwritable database looks like to asyncpg:
# worth retrying. A SQL error (a bug) is not in here and stops the program loudly; nor is a
# value PostgreSQL refuses (outcomes.refused_value). InternalClientError shows up when a
# connection is cut in the middle of a protocol exchange. A server that takes no writes (a
# standby a failover left the connection on), a lock wait past a role's `lock_timeout`, a
# snapshot too old and an I/O error on the server are the database's state, not the
# statement's: taken for refused values, they ended good jobs in `error`.
DB_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    asyncpg.exceptions.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.exceptions.InsufficientResourcesError,
    asyncpg.exceptions.TransactionRollbackError,
    asyncpg.exceptions.ReadOnlySQLTransactionError,
    asyncpg.exceptions.LockNotAvailableError,
    asyncpg.exceptions.SnapshotTooOldError,
    asyncpg.exceptions.PostgresIOError,
)

_session: tuple[int, str] | None = None


def session_name() -> str:
    """This process's application_name on every connection it opens: "sidelinja-worker" and a
    tag of its own, drawn once per process (a forked child draws its own). It shows the
    process's sessions in pg_stat_activity, and a worker registers it (job_workers.sessions)
    so that the rescue that declares it dead can end them: a worker stopped or cut off, not
    killed, otherwise keeps its open transactions' locks for as long as it stays so."""
    global _session
    pid = os.getpid()
    if _session is None or _session[0] != pid:
        _session = (pid, f"sidelinja-worker {secrets.token_hex(6)}")
    return _session[1]


def server_settings() -> dict[str, str]:
    """The settings of every session: jit off, as the claim's cost estimate on a big table can
    cross jit_above_cost, and compiling costs more milliseconds than the whole claim; and the
    process's `session_name`."""
    return {"jit": "off", "application_name": session_name()}


@dataclass(frozen=True)
class Database:
    url: str
    embedded: bool

    def describe(self) -> str:
        """The "using the database" line: as text, since a URL or folder can hold escapes."""
        if self.embedded:
            host = dict(p.split("=", 1) for p in urlsplit(self.url).query.split("&") if "=" in p)
            folder = Path(host.get("host", "?")).parent
            return f"using the embedded PostgreSQL in {printable(folder)}"
        return f"using the database at {printable(redact(self.url))}"


def redact(url: str) -> str:
    """The database URL or DSN without its password, for messages and logs, in every form libpq
    and asyncpg take: a URL's user info (postgresql:// or postgres://, percent-encoded or not,
    with @, ?, # or / in it), a `password` or `sslpassword` query parameter (its name
    percent-encoded too), and a keyword/value DSN's `password=` (quoted or not). Where the form
    is ambiguous it hides too much rather than too little: a shape it does not recognise (a
    one-slash typo, `postgresql:/u:pw@h`) has anything between `user:` and the last @ blanked,
    as the program that reads it may still find a password there."""
    import re  # local: this function is the only user
    from urllib.parse import unquote_plus

    hidden = "***"
    # The connection libraries ignore surrounding whitespace (a secret file's blank line), so
    # the scheme is looked for after it.
    url = url.strip()
    scheme, sep, rest = url.partition("://")
    if not sep or not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.:-]*", scheme):
        dsn = re.sub(
            r"(?i)(\b(?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'?|\S*)", rf"\g<1>{hidden}", url
        )
        return _hide_user_info(dsn, hidden)
    # The user info ends at the last @ before the path. A password with an unencoded / in it
    # ends the host part early, so without an @ there the first @ ends it, unless a query
    # parameter (name=value) comes first: then that @ is in the query.
    slash = rest.find("/")
    authority = rest if slash < 0 else rest[:slash]
    at = authority.rfind("@") if "@" in authority else rest.find("@")
    if "@" not in authority and "=" in rest[: max(at, 0)]:
        at = -1
    if at >= 0:
        user, colon, _password = rest[:at].partition(":")
        if colon:
            rest = f"{user}:{hidden}{rest[at:]}"
    path, question, query = rest.partition("?")
    if question:
        query, hash_, fragment = query.partition("#")
        params = []
        for param in query.split("&"):
            name, equals, _value = param.partition("=")
            if equals and unquote_plus(name).strip().lower() in ("password", "sslpassword"):
                param = f"{name}={hidden}"
            params.append(param)
        rest = f"{path}?{'&'.join(params)}{hash_}{fragment}"
    return f"{scheme}://{rest}"


def _hide_user_info(text: str, hidden: str) -> str:
    """`text` with anything between the first : after its scheme and slashes (if any) and its
    last @ blanked: the user info of a URL of a shape `redact` does not know. With no : after
    the scheme, what looked like one may be the user (`u:pw@h`): blanked from its :."""
    import re  # local: as in redact

    at = text.rfind("@")
    if at < 0:
        return text
    lead = re.match(r"[A-Za-z][A-Za-z0-9+.-]*:/*", text)
    colon = text.find(":", lead.end() if lead else 0, at)
    if colon < 0:
        colon = text.find(":", 0, at)
    if colon < 0:
        return text
    return f"{text[: colon + 1]}{hidden}{text[at:]}"


def resolve_database(url: str | None, data_dir: str | None) -> Database:
    """`url` (from --database-url or DATABASE_URL) if given; else the embedded server."""
    if url:
        return Database(url=url, embedded=False)
    folder = Path(data_dir) if data_dir else default_data_dir()
    return Database(url=start_embedded(folder), embedded=True)


async def init_connection(conn: asyncpg.Connection) -> None:
    """JSON through orjson, in jsonb's binary format (a version byte, then the text)."""
    await conn.set_type_codec(
        "jsonb",
        schema="pg_catalog",
        format="binary",
        encoder=_encode_jsonb,
        decoder=_decode_jsonb,
    )


class RawJson(bytes):
    """JSON already encoded (the executor encodes a result once, to catch a result that is not
    JSON while the job can still fail cleanly); the codec passes it through."""


def _encode_jsonb(value: Any) -> bytes:
    if type(value) is RawJson:
        return b"\x01" + value
    return b"\x01" + jsonvalues.dumps(value)


class UndecodableJson(str):
    """A jsonb value orjson refuses: PostgreSQL stores arrays and objects nested far deeper than
    orjson's 1,024 levels, and any plain-SQL writer can store one. Decoded as this string (the
    reason) instead of raising, so that one row never fails the result of a whole statement (a
    claim of 2,000 jobs, say); a payload that is one fails its own job (registry)."""


def _decode_jsonb(data: bytes) -> Any:
    try:
        return orjson.loads(data[1:])
    except orjson.JSONDecodeError as exc:
        return UndecodableJson(f"JSON this worker cannot read: {exc}")


async def connect(url: str, **kwargs: Any) -> asyncpg.Connection:
    """A connection to `url`; a UserError if there is none. A URL asyncpg cannot read (a port
    past 65535 overflows the socket call, an unclosed [ of an IPv6 host is a ValueError) is
    such an error too, not a traceback: every command connects here first."""
    try:
        conn = await asyncpg.connect(url, server_settings=server_settings(), **kwargs)
    except (*DB_ERRORS, asyncpg.PostgresError, ValueError, OverflowError) as exc:
        raise cannot_connect(url, exc) from None
    await init_connection(conn)
    return conn


# For the queue's own hot statements (claim, completion), whose plans do not depend on their
# parameters' values: left to choose, PostgreSQL kept re-planning the fair claim on every call
# (2-3 ms of planning for a 1 ms claim); its generic plan uses the same indexes (see
# bench/results/claim_plan_1m.txt).
GENERIC_PLANS = {"plan_cache_mode": "force_generic_plan"}


async def create_pool(
    url: str,
    *,
    min_size: int = 1,
    max_size: int = 4,
    generic_plans: bool = False,
    settings: Mapping[str, str] | None = None,
    prepare: Callable[[asyncpg.Connection], Awaitable[None]] | None = None,
) -> asyncpg.Pool:
    """A pool whose connections speak JSON through orjson; `prepare` runs on each new one
    after that. `settings` are server settings of its sessions, beside `server_settings()`.
    Connections above `min_size` close after asyncpg's 300 s of idleness."""

    async def init(conn: asyncpg.Connection) -> None:
        await init_connection(conn)
        if prepare is not None:
            await prepare(conn)

    try:
        pool = await BoundedPool(
            url,
            min_size=min_size,
            max_size=max_size,
            max_queries=50000,
            max_inactive_connection_lifetime=300.0,
            setup=None,
            init=init,
            reset=_reset_on_release,
            loop=None,
            connection_class=asyncpg.Connection,
            record_class=asyncpg.Record,
            server_settings={
                **server_settings(),
                **(GENERIC_PLANS if generic_plans else {}),
                **(settings or {}),
            },
        )
    # Any database error while the connections open and `prepare` runs, the protocol's own
    # too: a connection terminated during `prepare` raised asyncpg's InternalClientError
    # ("cannot switch to state 12"), which passed through as no UserError and ended a
    # starting worker with exit 2 where it goes on with its shared pool.
    except (*DB_ERRORS, asyncpg.PostgresError) as exc:
        raise cannot_connect(url, exc) from None
    assert pool is not None
    return pool


# How long a pool waits to take a connection back. Unbounded (asyncpg's default), a statement
# that timed out on a connection that died silently (half-open: no reset, no answer) left its
# release waiting forever for the cancellation's answer, and the caller with it. Bounded, the
# connection is terminated and the pool opens a new one. A healthy release takes milliseconds.
RELEASE_TIMEOUT_S = 5.0


class BoundedPool(asyncpg.Pool):
    """An asyncpg pool whose release is bounded by RELEASE_TIMEOUT_S unless the caller gives a
    timeout of its own; `pool.fetch` and friends, and `async with pool.acquire()`, included."""

    async def release(self, connection: Any, *, timeout: float | None = None) -> None:  # noqa: ASYNC109
        await super().release(connection, timeout=RELEASE_TIMEOUT_S if timeout is None else timeout)


async def _reset_on_release(conn: asyncpg.Connection) -> None:
    """What a connection needs when it goes back to the pool: nothing, as a rule. Every piece of
    session state this program sets is transaction-scoped (SET LOCAL, xact advisory locks) and
    LISTEN has a connection of its own, so asyncpg's default reset (advisory unlock, CLOSE ALL,
    UNLISTEN *, RESET ALL) was one wasted round trip after every claim and every outcome
    write: 8.6-9.1k -> 11-13k noop jobs/s at concurrency 50 in the benchmark. A transaction
    left open by an error is still rolled back."""
    if conn.is_in_transaction():
        await conn.execute("ROLLBACK")


def cannot_connect(url: str, exc: BaseException) -> UserError:
    """The error of a connection that failed: the URL redacted, and the reason with whatever
    `redact` hides from the URL blanked in it too, as the server echoes what it was given (a
    one-slash typo's user:password@host read as a database name)."""
    reason = _without(_one_line(exc), url)
    return UserError(
        f"cannot connect to the database at {printable(redact(url))}: {printable(reason)}"
    )


def _without(text: str, url: str) -> str:
    """`text` with every piece of `url` that `redact` hides blanked."""
    from difflib import SequenceMatcher  # local: only a failed connection needs it

    url = url.strip()
    shown = redact(url)
    matcher = SequenceMatcher(None, url, shown, autojunk=False)
    hidden = [url[i1:i2] for tag, i1, i2, _, _ in matcher.get_opcodes() if tag != "equal"]
    for piece in sorted(hidden, key=len, reverse=True):
        if piece:
            text = text.replace(piece, "***")
    return text


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def say(line: str) -> None:
    """One line to stderr: the program's remarks stay out of stdout, which scripts read."""
    print(line, file=sys.stderr, flush=True)
