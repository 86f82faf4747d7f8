"""A handler that misbehaves, against a real worker: whatever it raises, cancels, ignores or
hands back, its own job takes the failure, and the worker either goes on whole or dies loudly
and gives its jobs back. Before each fix below, the worker lost a slot without a word, ran a
job again and again at once, waited for ever, or died with other jobs' outcomes in hand."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta, tzinfo
from decimal import Decimal
from typing import Any
from uuid import UUID

import asyncpg
import pytest

from sidelinja_worker.queue import worker as worker_module
from sidelinja_worker.queue.client import NewJob
from sidelinja_worker.queue.context import JobContext
from sidelinja_worker.queue.errors import RetryJob
from sidelinja_worker.queue.logs import TEXT_MAX, JsonFormatter
from sidelinja_worker.queue.registry import Registry
from sidelinja_worker.queue.worker import WorkerDied
from tests.helpers import insert_jobs, job_type, run_burst, running_worker, wait_for


async def _noop(ctx: JobContext, payload: Any) -> str:
    return "ok"


async def _jobs(pool: asyncpg.Pool) -> dict[str, asyncpg.Record]:
    rows = await pool.fetch(
        "SELECT job_type, status::text AS status, attempts, error_msg FROM job_queue"
    )
    return {r["job_type"]: r for r in rows}


async def _self_cancelled(ctx: JobContext, payload: Any) -> None:
    raise asyncio.CancelledError


async def _awaits_a_cancelled_task(ctx: JobContext, payload: Any) -> None:
    inner = asyncio.create_task(asyncio.sleep(10))
    asyncio.get_running_loop().call_soon(inner.cancel)
    await inner


@pytest.mark.parametrize("handler", [_self_cancelled, _awaits_a_cancelled_task])
async def test_a_cancelled_error_of_the_handler_s_own_fails_its_attempt(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, handler: Any
) -> None:
    """A CancelledError the worker did not cause was taken for a stop: the job went back with
    its attempt returned and ran again at once, for ever (4,305 runs in 10 s), without a line
    in the log. It is the handler's failure: an attempt, retried with backoff."""
    await insert_jobs(pool, workspace, 1, job_type_name="bad")
    registry = Registry([job_type("bad", handler)])
    await asyncio.wait_for(run_burst(pool, db_url, registry), 30)
    row = (await _jobs(pool))["bad"]
    assert (row["status"], row["attempts"]) == ("retry", 1)
    assert "CancelledError: the handler's own cancellation escaped it" in row["error_msg"]


async def test_a_handler_s_leftover_cancel_of_its_slot_loses_no_slot(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """A handler that armed a cancel of the task it ran in and returned (a timeout of its own,
    never disarmed) cancelled the slot once it was idle: the slot ended without a word, and
    with one slot the worker ran nothing more while it looked alive."""
    armed = asyncio.Event()

    async def leaves_a_cancel(ctx: JobContext, payload: Any) -> None:
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().call_later(0.2, task.cancel)
        armed.set()

    registry = Registry([job_type("arms", leaves_a_cancel), job_type("later", _noop)])
    await insert_jobs(pool, workspace, 1, job_type_name="arms")
    async with running_worker(pool, db_url, registry, max_concurrent=1, poll_interval_s=0.05):
        await armed.wait()
        await asyncio.sleep(0.5)  # the cancel lands on the idle slot
        await insert_jobs(pool, workspace, 3, job_type_name="later")
        await wait_for(
            lambda: pool.fetchval(
                "SELECT count(*) = 3 FROM job_queue WHERE job_type = 'later'"
                " AND status = 'completed'"
            ),
            15,
            "the later jobs completed by the one slot",
        )


class Unprintable(Exception):
    def __str__(self) -> str:
        raise ValueError("no message")


class UnprintableRetry(RetryJob):
    def __str__(self) -> str:
        return 42  # type: ignore[return-value]


class Custom(BaseException):
    pass


async def test_an_exception_that_cannot_be_printed_or_is_no_exception_fails_its_job_only(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """An exception whose __str__ raises (or returns no str), GeneratorExit, or a BaseException
    of the handler's own went out of the executor: the slot died, and the worker with it
    (exit 3), every other running job interrupted. Each now fails its own job."""
    raised: dict[str, BaseException] = {
        "unprintable": Unprintable(),
        "retry": UnprintableRetry("x"),
        "generator_exit": GeneratorExit(),
        "custom": Custom("mine"),
    }

    def raising(error: BaseException) -> Any:
        async def handler(ctx: JobContext, payload: Any) -> None:
            raise error

        return handler

    registry = Registry(
        [job_type(name, raising(error)) for name, error in raised.items()]
        + [job_type("fine", _noop)]
    )
    for name in (*raised, "fine"):
        await insert_jobs(pool, workspace, 1, job_type_name=name)
    await run_burst(pool, db_url, registry)
    rows = await _jobs(pool)
    assert rows["fine"]["status"] == "completed"
    for name in raised:
        assert (rows[name]["status"], rows[name]["attempts"]) == ("retry", 1), name
    assert "whose message could not be read" in rows["unprintable"]["error_msg"]
    assert rows["custom"]["error_msg"] == "Custom: mine"


async def test_follow_ups_with_a_value_that_cannot_be_sent_fail_their_own_job(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """64 follow-ups or more go by COPY, which says a value it cannot encode (a Decimal read
    from a numeric column) as a plain TypeError: taken for a fault of the writer's, it killed
    the outcome writer and the worker, and the outcomes of the jobs done beside it were lost.
    And a payload mapping that could not be read killed it the same way, by any path. Each
    fails its own job now."""

    class Unreadable(Mapping[str, Any]):
        def __getitem__(self, key: str) -> Any:
            raise KeyError(key)

        def __iter__(self) -> Iterator[str]:
            raise RuntimeError("unreadable")

        def __len__(self) -> int:
            return 1

    async def many(ctx: JobContext, payload: Any) -> None:
        for i in range(64):
            ctx.enqueue_on_success(
                NewJob(ctx.workspace_id, "fine", payload={"amount": Decimal("1.5"), "i": i})
            )

    async def unreadable(ctx: JobContext, payload: Any) -> None:
        ctx.enqueue_on_success(NewJob(ctx.workspace_id, "fine", payload=Unreadable()))

    registry = Registry(
        [job_type("many", many), job_type("unreadable", unreadable), job_type("fine", _noop)]
    )
    for name in ("many", "unreadable", "fine"):
        await insert_jobs(pool, workspace, 1, job_type_name=name)
    await run_burst(pool, db_url, registry)  # no WorkerDied
    rows = await _jobs(pool)
    assert rows["fine"]["status"] == "completed"
    assert rows["many"]["status"] == "error"
    assert "could not be stored" in rows["many"]["error_msg"], rows["many"]["error_msg"]
    assert (rows["unreadable"]["status"], rows["unreadable"]["attempts"]) == ("retry", 1)
    assert "payload could not be read" in rows["unreadable"]["error_msg"]
    assert await pool.fetchval("SELECT count(*) FROM job_queue") == 3  # no follow-up went in


def _stubborn(released: asyncio.Event, running: asyncio.Event) -> Any:
    """A handler that ignores its cancellation until the test lets it go."""

    async def handler(ctx: JobContext, payload: Any) -> None:
        running.set()
        while not released.is_set():
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                pass

    return handler


async def test_a_handler_that_ignores_its_timeout_ends_the_worker(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelled at its timeout, a handler that swallowed the cancellation kept its slot and,
    through the heartbeat, its job, for ever, and no line said so. Past HANDLER_OVERRUN_S the
    worker dies, and its job goes back counted."""
    monkeypatch.setattr(worker_module, "HANDLER_OVERRUN_S", 1.0)
    released, running = asyncio.Event(), asyncio.Event()
    registry = Registry([job_type("stubborn", _stubborn(released, running), timeout_s=1)])
    await insert_jobs(pool, workspace, 1, job_type_name="stubborn")
    try:
        with pytest.raises(WorkerDied, match="ignoring the cancellation"):
            await asyncio.wait_for(run_burst(pool, db_url, registry), 20)
    finally:
        released.set()
    row = (await _jobs(pool))["stubborn"]
    assert (row["status"], row["attempts"]) == ("retry", 1)
    assert "abandoned by worker" in row["error_msg"]


async def test_a_handler_that_ignores_the_stop_s_cancellation_does_not_hold_the_stop(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At a stop past its grace period, the worker waited for the cancelled handlers for
    ever: a SIGTERM never ended the process. It waits CANCELLED_WITHIN_S, then dies and gives
    their jobs back."""
    monkeypatch.setattr(worker_module, "CANCELLED_WITHIN_S", 1.0)
    released, running = asyncio.Event(), asyncio.Event()
    registry = Registry([job_type("stubborn", _stubborn(released, running))])
    await insert_jobs(pool, workspace, 1, job_type_name="stubborn")
    try:
        with pytest.raises(WorkerDied, match="after their cancellation at the stop"):
            async with running_worker(pool, db_url, registry, grace_s=0.5, poll_interval_s=0.05):
                await asyncio.wait_for(running.wait(), 15)
    finally:
        released.set()
    row = (await _jobs(pool))["stubborn"]
    assert (row["status"], row["attempts"]) == ("retry", 1)


async def test_a_closed_shared_http_client_is_made_again(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """A handler that closed the shared HTTP client (`async with ctx.services.http:`) left
    every later call of every job in that worker failing with "the client has been closed"."""
    seen: list[bool] = []

    async def closes(ctx: JobContext, payload: Any) -> None:
        await ctx.services.http.aclose()

    async def looks(ctx: JobContext, payload: Any) -> None:
        seen.append(ctx.services.http.is_closed)

    registry = Registry([job_type("closes", closes), job_type("looks", looks)])
    async with running_worker(pool, db_url, registry, max_concurrent=1, poll_interval_s=0.05):
        for name in ("closes", "looks"):
            await insert_jobs(pool, workspace, 1, job_type_name=name)
            await wait_for(
                lambda: pool.fetchval(
                    "SELECT count(*) = 0 FROM job_queue WHERE status <> 'completed'"
                ),
                15,
                f"{name} completed",
            )
    assert seen == [False]


def test_a_log_line_with_a_lone_surrogate_or_megabytes_is_one_bounded_json_line() -> None:
    """orjson refuses a lone surrogate (an undecodable file name in an OSError): the record
    was lost, and logging's complaint went out as lines that are not JSON. And an exception
    carrying megabytes was written whole at every attempt."""
    try:
        raise ValueError("name \udc80 " + "x" * 100_000)
    except ValueError:
        record = logging.LogRecord("t", logging.ERROR, __file__, 1, "bad %s", ("\udc80",), None)
        record.exc_info = sys.exc_info()
    line = JsonFormatter().format(record)
    assert line.startswith("{") and line.endswith("}") and "\n" not in line
    assert len(line) < 2 * TEXT_MAX + 1000 and "more characters cut" in line


class _RaisingZone(tzinfo):
    def utcoffset(self, dt: datetime | None) -> timedelta:
        raise RuntimeError("no offset")

    def dst(self, dt: datetime | None) -> timedelta | None:
        return None


class _WrongZone(tzinfo):
    def utcoffset(self, dt: datetime | None) -> timedelta:
        return "+01:00"  # type: ignore[return-value]

    def dst(self, dt: datetime | None) -> timedelta | None:
        return None


async def test_a_datetime_with_a_broken_time_zone_fails_its_own_job(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """orjson writes datetimes itself and trusts their tzinfo: one whose utcoffset() raises
    killed the worker by a segfault (no log line, every held job left to the lease), and one
    that returns no timedelta was stored as "+474710:15". Python's isoformat checks both: the
    job fails as a result that is not JSON, or a follow-up that could not be stored."""
    when = datetime(2026, 12, 7, 12, 30, 5, 9)

    def returns(value: Any) -> Any:
        async def handler(ctx: JobContext, payload: Any) -> Any:
            return value

        return handler

    async def follow_up(ctx: JobContext, payload: Any) -> None:
        at = when.replace(tzinfo=_RaisingZone())
        ctx.enqueue_on_success(NewJob(ctx.workspace_id, "fine", payload={"at": at}))

    registry = Registry(
        [
            job_type("raising", returns({"at": when.replace(tzinfo=_RaisingZone())})),
            job_type("wrong", returns([when.replace(tzinfo=_WrongZone())])),
            job_type("fine", returns({"at": when.replace(tzinfo=UTC), "naive": when})),
            job_type("follow_up", follow_up),
        ]
    )
    for name in ("raising", "wrong", "fine", "follow_up"):
        await insert_jobs(pool, workspace, 1, job_type_name=name)
    await run_burst(pool, db_url, registry)
    rows = await _jobs(pool)
    for name in ("raising", "wrong"):
        assert rows[name]["status"] == "error", dict(rows[name])
        assert "result that is not JSON" in rows[name]["error_msg"]
    assert rows["follow_up"]["status"] == "error", dict(rows["follow_up"])
    assert "could not be stored" in rows["follow_up"]["error_msg"]
    assert await pool.fetchval("SELECT count(*) FROM job_queue") == 4  # no follow-up went in
    result = await pool.fetchval("SELECT result FROM job_queue WHERE job_type = 'fine'")
    assert result == {
        "at": "2026-12-07T12:30:05.000009+00:00",
        "naive": "2026-12-07T12:30:05.000009",
    }
