"""Live job events: one LISTEN on `sidelinja_job_events` per app, fanned out to the open pages
(Server-Sent Events), each page getting only the workspaces its token may see.

Any role may NOTIFY any channel, so a notification is a hint, never the news itself: before a
page gets an event, the hub reads the job again under the page's scope, its token's workspace or
the whole queue (row-level security), and sends the row's values only if the row exists there
and agrees with what the notification claims (status, attempts, progress, type). A forged
notification naming an unknown job, another workspace's job or a state the job is not in shows
nothing. Any role may also NOTIFY as fast as it likes: a notification costs the listener a
place in a bounded queue, and the hub confirms what arrives once per scope its pages watch
(a query per BATCH_MAX claims), however many pages watch it.

PostgreSQL publishes status events only while some listener holds a lease (queue setting
`job_events` = "auto", the default), so the hub registers its LISTEN as one: on start, renewed every
LEASE_RENEW_S on the listening connection itself, and withdrawn on stop. A hub whose connection or
process dies stops renewing, and the events stop within LEASE_S. The SpacetimeDB forwarder is fed
by the hub (`payload_listeners`), so the hub's lease covers it as well."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeAlias
from uuid import UUID

import asyncpg
import orjson

from sidelinja_worker.admin import store
from sidelinja_worker.admin.store import Scope
from sidelinja_worker.queue.db import DB_ERRORS

log = logging.getLogger("sidelinja_worker.admin")
CHANNEL = "sidelinja_job_events"
KEEPALIVE_S = 15.0
# How often an open stream checks that its token (or session) still holds, whatever the traffic:
# a revoked token's stream ends within this, plus one database round trip.
REVALIDATE_S = 2.0
QUEUE_MAX = 1000
# Any role may send junk on the channel: one warning line per this many seconds, with a count.
MALFORMED_LOG_S = 60.0
FORWARD_MAX = 10_000  # raw payloads waiting for confirmation before forwarding; more dropped
INCOMING_MAX = 10_000  # raw payloads waiting for confirmation for the streams; more dropped
BATCH_MAX = 500  # events confirmed with one query
# The listener lease: renewed three times within it, so one slow or failed renewal loses nothing.
LEASE_S = 30.0
LEASE_RENEW_S = 10.0
LEASE_LABEL = "admin"
# Open streams: each holds a connection and checks its token every REVALIDATE_S. Unbounded, 6,000
# idle streams of one token kept every page waiting 1.5-2.9 s. A person has a stream per open
# page; a token shared by a team, some dozens.
STREAMS_PER_TOKEN = 50
STREAMS_MAX = 500
# A stream opens with the present state of the jobs its page shows (`?jobs=`), at most this many
# (a workflow page draws workflow.MAX_NODES): a change between the page's render and its stream's
# subscription sent its event to nobody, and the page showed the job as it was (a cancelled job
# as running, for good) until reloaded.
SNAPSHOT_MAX = 300


# A stream's place in the hub: the queue its events arrive on.
Subscription: TypeAlias = asyncio.Queue[dict[str, Any]]


class TooManyStreams(Exception):
    """A stream refused: its token (429), or the app as a whole (503), has as many open as it
    may."""

    def __init__(self, message: str, status_code: int) -> None:
        super().__init__(message)
        self.status_code = status_code


def explode(payload: str) -> list[dict[str, Any]]:
    """One event per job: a status batch `{..., "ids": [...], "attempts": [...]}` becomes one
    event per id; a progress report is already one event. Raises ValueError for a payload that
    is not one of the two shapes."""
    data = orjson.loads(payload)
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    if "ids" not in data:
        return [data]
    ids, attempts = data["ids"], data.get("attempts")
    if not isinstance(ids, list) or not isinstance(attempts, list):
        raise ValueError("ids and attempts must be lists")
    common = {k: v for k, v in data.items() if k not in ("ids", "attempts")}
    return [
        {**common, "id": job_id, "attempts": n} for job_id, n in zip(ids, attempts, strict=True)
    ]


def _job_id(event: dict[str, Any]) -> UUID | None:
    try:
        return UUID(str(event.get("id")))
    except ValueError:
        return None


def type_agrees(claimed: object, shown: str) -> bool:
    """Whether a notification's job_type agrees with the row's, read to its first
    store.TEXT_SHOWN characters (`shown`).

    A null type is no claim: the status-event trigger sends null for a type whose JSON text is
    over 512 bytes, and the event still names its jobs. Accepting it lets a forger through no
    further than leaving the key out always did: the event sent is built from the row alone, the
    job's id, workspace, status and attempts (or progress) must still agree, and the stream reads
    the row under its own scope, so a page shows the job's present state and nothing else.

    A named type agrees when it is the row's as far as the row is read: a progress report names
    its type whole, which may be longer than what the admin reads."""
    if claimed is None:
        return True
    return isinstance(claimed, str) and claimed[: store.TEXT_SHOWN] == shown


def confirmed(claim: dict[str, Any], row: asyncpg.Record | None) -> dict[str, Any] | None:
    """The event to send for a claim, built from the row alone; None unless the row agrees
    with every field the claim makes (workspace, status, attempts or progress, and the type
    unless the trigger left it out)."""
    if row is None or claim.get("status") != row["status"]:
        return None
    if claim.get("workspace_id") != str(row["workspace_id"]):
        return None
    if not type_agrees(claim.get("job_type"), row["job_type"]):
        return None
    if "max_attempts" in claim and claim["max_attempts"] != row["max_attempts"]:
        return None
    # A status event names the attempts, a progress report the progress: one or the other.
    if "attempts" not in claim and "progress" not in claim:
        return None
    if "attempts" in claim and claim["attempts"] != row["attempts"]:
        return None
    event = row_event(row)
    if "progress" in claim:
        if claim["progress"] != row["progress"]:
            return None
        event["progress"] = row["progress"]
    return event


def row_event(row: asyncpg.Record) -> dict[str, Any]:
    """The event a page gets for a job, from its row (jobs_for_events) alone."""
    return {
        "id": str(row["id"]),
        "workspace_id": str(row["workspace_id"]),
        "job_type": row["job_type"],
        "status": row["status"],
        "attempts": row["attempts"],
        "max_attempts": row["max_attempts"],
    }


def snapshot_ids(text: str) -> list[UUID]:
    """The job ids of a stream's `?jobs=` (comma-separated), the readable ones, at most
    SNAPSHOT_MAX."""
    ids: list[UUID] = []
    for part in text.split(",")[:SNAPSHOT_MAX]:
        try:
            ids.append(UUID(part.strip()))
        except ValueError:
            continue
    return ids


PROGRESS_KEYS = ("id", "workspace_id", "job_type", "status", "progress")
BATCH_KEYS = ("workspace_id", "job_type", "status", "max_attempts")


def as_payloads(events: list[dict[str, Any]]) -> list[str]:
    """Confirmed events as the notifications PostgreSQL publishes, built from the rows' values
    alone (a forger may add fields of its own to a notification the rows confirm): a progress
    report each, and status events batched by workspace, type, status and max attempts.

    The type is the row's, read to its first store.TEXT_SHOWN characters, also where PostgreSQL
    sent null (a type whose JSON text is over 512 bytes), so each payload stays bounded: a few
    kilobytes of type at most, and the jobs of one notification (150 from the trigger; a forged
    one holds fewer than 8000 bytes of ids)."""
    out: list[str] = []
    batches: defaultdict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if "progress" in e:
            out.append(orjson.dumps({k: e[k] for k in PROGRESS_KEYS}).decode())
        else:
            batches[tuple(e[k] for k in BATCH_KEYS)].append(e)
    for common, batch in batches.items():
        payload = dict(zip(BATCH_KEYS, common, strict=True))
        payload.update(ids=[e["id"] for e in batch], attempts=[e["attempts"] for e in batch])
        out.append(orjson.dumps(payload).decode())
    return out


class EventHub:
    def __init__(self, url: str, pool: asyncpg.Pool) -> None:
        self._url = url
        self._pool = pool  # the privileged pool; confirmations run scoped (store.scoped)
        self._conn: asyncpg.Connection | None = None
        self._subscribers: dict[Subscription, Scope] = {}
        # Called with each payload the database confirms (the SpacetimeDB forwarder); must not
        # block. What they get is rebuilt from the confirmed rows (as_payloads).
        self.payload_listeners: list[Callable[[str], None]] = []
        self._to_forward: asyncio.Queue[str] = asyncio.Queue(FORWARD_MAX)
        self._forwarder: asyncio.Task[None] | None = None
        self._incoming: asyncio.Queue[str] = asyncio.Queue(INCOMING_MAX)
        self._dispatcher: asyncio.Task[None] | None = None
        self._lease_id = uuid.uuid4()
        self._renewer: asyncio.Task[None] | None = None
        self._malformed, self._malformed_logged_at = 0, -MALFORMED_LOG_S

    async def start(self) -> None:
        self._conn = await asyncpg.connect(self._url)
        await self._conn.add_listener(CHANNEL, self._on_notify)
        await self._renew_lease(self._conn)
        self._renewer = asyncio.create_task(self._keep_lease(self._conn), name="admin-event-lease")
        self._forwarder = asyncio.create_task(self._forward(), name="admin-event-forwarder")
        self._dispatcher = asyncio.create_task(self._dispatch(), name="admin-event-dispatcher")

    async def stop(self) -> None:
        for task in (self._renewer, self._forwarder, self._dispatcher):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if self._conn is not None:
            try:
                await self._conn.execute("SELECT sidelinja_job_events_unlisten($1)", self._lease_id)
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                # The lease then runs out by itself within LEASE_S.
                log.warning("cannot withdraw the event listener lease (%s)", exc)
            await self._conn.close()

    async def _renew_lease(self, conn: asyncpg.Connection) -> None:
        await conn.execute(
            "SELECT sidelinja_job_events_listen($1, $2, $3)", self._lease_id, LEASE_LABEL, LEASE_S
        )

    async def _keep_lease(self, conn: asyncpg.Connection) -> None:
        """Renews the lease on the listening connection: once that connection is gone, so is
        the renewal, and PostgreSQL stops publishing for this hub within LEASE_S."""
        while True:
            await asyncio.sleep(LEASE_RENEW_S)
            if conn.is_closed():  # its LISTEN is gone too: nothing left to keep alive
                log.warning("the event listener connection closed; live events stop")
                return
            try:
                await self._renew_lease(conn)
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                log.warning("cannot renew the event listener lease (%s); retrying", exc)

    async def _forward(self) -> None:
        """Confirms each payload for the listeners, in the order received, one query each."""
        while True:
            payload = await self._to_forward.get()
            try:
                claims = explode(payload)
                events = await self.confirm(Scope(None, None), claims)
            except (ValueError, KeyError, TypeError):
                continue
            except (OSError, asyncpg.PostgresError) as exc:
                log.warning("cannot confirm an event for forwarding (%s); dropped", exc)
                continue
            for confirmed_payload in as_payloads(events):
                for listener in self.payload_listeners:
                    listener(confirmed_payload)

    def _on_notify(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        """Queues the payload, no more: any role may NOTIFY as fast as it likes, so the work a
        notification costs here must not grow with the streams open (a full queue drops it)."""
        if self.payload_listeners and not self._to_forward.full():
            self._to_forward.put_nowait(payload)
        if self._subscribers and not self._incoming.full():
            self._incoming.put_nowait(payload)

    async def _dispatch(self) -> None:
        """Confirms what arrives, up to BATCH_MAX claims at a time, and hands each stream the
        events its scope confirms."""
        while True:
            claims = self._claims(await self._incoming.get())
            while len(claims) < BATCH_MAX and not self._incoming.empty():
                claims += self._claims(self._incoming.get_nowait())
            try:
                await self._deliver(claims)
            # Any failure of the database: one task serves every stream, so it goes on.
            except (*DB_ERRORS, asyncpg.PostgresError) as exc:
                log.warning("cannot confirm events for the live streams (%s); dropped", exc)

    def _claims(self, payload: str) -> list[dict[str, Any]]:
        """The payload's claims, one per job; none for a malformed one (counted and logged)."""
        try:
            return [c for c in explode(payload) if isinstance(c, dict)]
        except (ValueError, KeyError, TypeError):
            self._malformed += 1
            now = time.monotonic()
            if now >= self._malformed_logged_at + MALFORMED_LOG_S:
                log.warning("ignored %d malformed %s payloads", self._malformed, CHANNEL)
                self._malformed, self._malformed_logged_at = 0, now
            return []

    async def _deliver(self, claims: list[dict[str, Any]]) -> None:
        """One confirmation per workspace the streams watch (None: a platform stream's every
        workspace), however many streams watch it. The claimed workspace only narrows what is
        asked; the database, under that scope, decides what is sent."""
        for workspace in {s.workspace_id for s in self._subscribers.values()}:
            scope = Scope(None, workspace)
            wanted = [c for c in claims if scope.allows(str(c.get("workspace_id", "")))]
            events = await self.confirm(scope, wanted) if wanted else []
            for queue, watcher in list(self._subscribers.items()):
                if watcher.workspace_id == workspace:
                    for event in events[: max(0, QUEUE_MAX - queue.qsize())]:
                        queue.put_nowait(event)

    async def confirm(self, scope: Scope, claims: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The claims the database confirms under the scope, as events built from the rows."""
        ids = [_job_id(c) for c in claims]
        wanted = list({i for i in ids if i is not None})
        if not wanted:
            return []
        async with store.scoped(self._pool, scope) as conn:
            rows = {r["id"]: r for r in await store.jobs_for_events(conn, wanted)}
        out = []
        for claim, job_id in zip(claims, ids, strict=True):
            event = confirmed(claim, rows.get(job_id)) if job_id is not None else None
            if event is not None:
                out.append(event)
        return out

    async def snapshot(self, scope: Scope, ids: list[UUID]) -> list[dict[str, Any]]:
        """The present state of the jobs `ids` the scope sees, as events (with progress where a
        job has one); none of a job it does not see."""
        if not ids:
            return []
        async with store.scoped(self._pool, scope) as conn:
            rows = await store.jobs_for_events(conn, ids)
        events = []
        for row in rows:
            event = row_event(row)
            if row["progress"] is not None:
                event["progress"] = row["progress"]
            events.append(event)
        return events

    def subscribe(self, scope: Scope) -> Subscription:
        """A new stream's queue, counted against STREAMS_MAX and STREAMS_PER_TOKEN until
        unsubscribe(queue); TooManyStreams past either."""
        if len(self._subscribers) >= STREAMS_MAX:
            raise TooManyStreams(f"{STREAMS_MAX} live streams are open; try again later", 503)
        if (
            sum(s.token_id == scope.token_id for s in self._subscribers.values())
            >= STREAMS_PER_TOKEN
        ):
            raise TooManyStreams(f"this token has {STREAMS_PER_TOKEN} live streams open", 429)
        queue: Subscription = asyncio.Queue(QUEUE_MAX)
        self._subscribers[queue] = scope
        return queue

    def unsubscribe(self, queue: Subscription) -> None:
        self._subscribers.pop(queue, None)

    async def stream(
        self, scope: Scope, still_valid: Callable[[], Awaitable[bool]] | None = None
    ) -> AsyncIterator[bytes]:
        """frames() of a queue of its own, given back when the stream ends."""
        queue = self.subscribe(scope)
        try:
            async for frame in self.frames(queue, still_valid):
                yield frame
        finally:
            self.unsubscribe(queue)

    async def frames(
        self,
        queue: Subscription,
        still_valid: Callable[[], Awaitable[bool]] | None = None,
        first: Callable[[], Awaitable[list[dict[str, Any]]]] | None = None,
    ) -> AsyncIterator[bytes]:
        """SSE frames for one page until it goes away, or its token is revoked (checked every
        REVALIDATE_S, busy or idle); a comment now and then keeps proxies from closing an idle
        stream. `queue` is the page's, from subscribe(), holding events the hub confirmed.
        `first`: the events sent before any other (snapshot()), read once the queue is
        subscribed, so no change falls between the two."""
        yield b"retry: 2000\n: connected\n\n"
        for event in await first() if first is not None else []:
            yield b"data: " + orjson.dumps(event) + b"\n\n"
        now = time.monotonic()
        check_at, keepalive_at = now + REVALIDATE_S, now + KEEPALIVE_S
        while True:
            now = time.monotonic()
            if now >= check_at:
                if still_valid is not None and not await still_valid():
                    return
                check_at = time.monotonic() + REVALIDATE_S
            if now >= keepalive_at:
                yield b": keepalive\n\n"
                keepalive_at = time.monotonic() + KEEPALIVE_S
            try:
                event = await asyncio.wait_for(
                    queue.get(), max(0.0, min(check_at, keepalive_at) - time.monotonic())
                )
            except TimeoutError:
                continue
            yield b"data: " + orjson.dumps(event) + b"\n\n"
            keepalive_at = time.monotonic() + KEEPALIVE_S
