"""One bad outcome never blocks the others, and values from outside are clamped before they
reach SQL or a timer: a batch PostgreSQL refuses for one job's values is written row by row, the
offender ends in `error` saying what was wrong, every other job completes."""

from __future__ import annotations

import asyncio
import math
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidelinja_worker import settings
from sidelinja_worker.admin import store as admin_store
from sidelinja_worker.cli.main import build_parser
from sidelinja_worker.queue import maintenance, pools, store
from sidelinja_worker.queue.backoff import DEFER_MAX_S, RETRY_MAX_S, clamp_s, defer_until
from sidelinja_worker.queue.client import NewJob
from sidelinja_worker.queue.context import JobContext
from sidelinja_worker.queue.db import RawJson, init_connection
from sidelinja_worker.queue.errors import Defer, RetryJob, UserError
from sidelinja_worker.queue.executor import (
    MAX_PAYLOAD_BYTES,
    MAX_PAYLOAD_CONTAINERS,
    MAX_RESULT_BYTES,
    timeout_for,
)
from sidelinja_worker.queue.jobs import ClaimedJob
from sidelinja_worker.queue.outcomes import OutcomeWriter
from sidelinja_worker.queue.registry import Registry
from sidelinja_worker.queue.settings import WorkerSettings
from sidelinja_worker.queue.store import Failure, Release
from sidelinja_worker.services.classify import parse_retry_after, retry_after_s
from tests.helpers import (
    contend_unique_key,
    job_type,
    make_workspace,
    run_burst,
    wait_for,
    wait_for_sql,
)


async def _claimed(pool: asyncpg.Pool, workspace: UUID, n: int) -> tuple[UUID, list[UUID]]:
    """A registered worker holding `n` running jobs."""
    worker_id = UUID(int=99)
    await store.register_worker(pool, worker_id, "test", 1, None, 60)
    await pool.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload)"
        " SELECT $1, 'noop', '{}' FROM generate_series(1, $2)",
        workspace,
        n,
    )
    jobs = await store.claim(pool, worker_id, n, None)
    return worker_id, [j.id for j in jobs]


async def test_a_follow_up_whose_unique_key_never_resolves_fails_its_job_not_the_writer(
    pool: asyncpg.Pool, workspace: UUID
) -> None:
    """A follow-up job whose unique key is held at every insert, its holder gone by the look-up
    after it (finished between the two, five times over: the client's rounds), made the client
    raise RuntimeError inside the completion's write. No write caught it: the outcome writer
    died, and with it the worker (exit 3), every other job it ran handed on. Two statement
    triggers stand in for the writers that keep making and finishing the holder: one adds a
    holder before each insert into job_queue, the other finishes it after. Now that job's
    attempt fails (transient), and the writer writes every other outcome and lives on."""
    worker_id, ids = await _claimed(pool, workspace, 3)
    await contend_unique_key(pool, workspace, "contended")
    writer = OutcomeWriter(pool, worker_id)
    task = asyncio.create_task(writer.run())
    try:
        writer.completed(
            ids[0], RawJson(b"{}"), [NewJob(workspace, "noop", unique_key="contended")]
        )
        writer.completed(ids[1], RawJson(b"{}"), [NewJob(workspace, "noop", unique_key="free")])
        writer.completed(ids[2], RawJson(b"{}"))
        drained = asyncio.create_task(writer.drain(30))
        await asyncio.wait([task, drained], return_when=asyncio.FIRST_COMPLETED)
        assert not task.done(), task.exception()
        assert drained.result()
    finally:
        task.cancel()
    rows = {
        r[0]: (r[1], r[2])
        for r in await pool.fetch(
            "SELECT id, status::text, error_msg FROM job_queue WHERE id = ANY($1)", ids
        )
    }
    assert [rows[i][0] for i in ids] == ["retry", "completed", "completed"]
    assert rows[ids[0]][1].startswith(
        "its follow-up jobs could not be enqueued: UniqueKeyUnresolved"
    )
    assert await pool.fetchval("SELECT count(*) FROM job_queue WHERE unique_key = 'free'") == 1


async def test_a_refused_value_in_a_batch_fails_only_its_job(
    pool: asyncpg.Pool, workspace: UUID
) -> None:
    worker_id, ids = await _claimed(pool, workspace, 14)
    writer = OutcomeWriter(pool, worker_id)
    good_done, bad_done = ids[:4], ids[4:6]
    good_failed, bad_failed = ids[6:8], ids[8:11]
    good_released, bad_released = ids[11], ids[12:14]
    for job_id in good_done:
        writer.completed(job_id, RawJson(b'{"ok": true}'))
    writer.completed(bad_done[0], RawJson(b'{"text": "a\\u0000b"}'))  # JSON jsonb cannot hold
    writer.completed(bad_done[1], RawJson(b"1e1000000"))  # a number out of numeric's range
    for job_id in good_failed:
        writer.failed(Failure(job_id, "transient", "fine", False, 30.0))
    writer.failed(Failure(bad_failed[0], "transient", "NUL \x00 in text", False, 30.0))
    writer.failed(Failure(bad_failed[1], "transient", "lone \ud800 surrogate", False, 30.0))
    writer.failed(Failure(bad_failed[2], "transient", "far out", False, 1e300))
    writer.released(Release(good_released, None, "later"))
    writer.released(Release(bad_released[0], None, "NUL \x00 reason"))
    writer.released(Release(bad_released[1], datetime.now(UTC), "\ud800"))
    await writer._flush()  # raises if one bad value stops the writer

    rows = {
        r["id"]: r for r in await pool.fetch("SELECT id, status::text, error_msg FROM job_queue")
    }
    assert {rows[i]["status"] for i in good_done} == {"completed"}
    assert {rows[i]["status"] for i in good_failed} == {"retry"}
    assert rows[good_released]["status"] == "pending"
    for job_id in bad_done:
        assert rows[job_id]["status"] == "error"
        assert rows[job_id]["error_msg"].startswith("its result could not be stored:")
    assert "unsupported Unicode escape" in rows[bad_done[0]]["error_msg"]
    assert "overflows numeric" in rows[bad_done[1]]["error_msg"]
    for job_id in bad_failed:
        assert rows[job_id]["status"] == "error"
        assert rows[job_id]["error_msg"].startswith("its failure could not be stored:")
    for job_id in bad_released:
        assert rows[job_id]["status"] == "error"
        assert rows[job_id]["error_msg"].startswith("its deferral could not be stored:")
    assert writer.pending() == 0 and not writer.unwritten()


async def _bad(ctx: JobContext, payload: Any) -> Any:
    kind = payload.kind
    if kind == "nul_result":
        return {"text": "a\x00b"}
    if kind == "huge_result":
        return {"text": "x" * (MAX_RESULT_BYTES + 1)}
    if kind == "nul_message":
        raise RetryJob("the service said \x00\ud800", after_s=float("nan"))
    if kind == "huge_retry":
        raise RetryJob("slow down", after_s=1e300)
    if kind == "bad_defer":
        raise Defer("not now \x00", after_s=float("inf"))
    if kind == "bad_progress":
        await ctx.progress("half \x00 way", float("nan"))
        await ctx.progress("x" * 10_000, 1e300)
    return {"ok": True}


async def test_bad_values_from_handlers_fail_or_clamp_only_their_own_job(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    kinds = ["nul_result", "huge_result", "nul_message", "huge_retry", "bad_defer", "bad_progress"]
    ids = {}
    for kind in [*kinds, *["ok"] * 20]:
        ids.setdefault(kind, []).append(
            await pool.fetchval(
                "INSERT INTO job_queue (workspace_id, job_type, payload)"
                " VALUES ($1, 'bad', jsonb_build_object('kind', $2::text)) RETURNING id",
                workspace,
                kind,
            )
        )
    started = datetime.now(UTC)
    await run_burst(pool, db_url, Registry([job_type("bad", _bad)]), max_concurrent=8)
    rows = {
        r["id"]: r
        for r in await pool.fetch(
            "SELECT id, status::text, error_msg, scheduled_for, progress FROM job_queue"
        )
    }

    def one(kind: str) -> asyncpg.Record:
        return rows[ids[kind][0]]

    assert {rows[i]["status"] for i in ids["ok"]} == {"completed"}
    assert one("nul_result")["status"] == "error"  # orjson writes \u0000, which jsonb refuses
    assert one("nul_result")["error_msg"].startswith("its result could not be stored:")
    assert one("huge_result")["status"] == "error"
    assert "over the cap" in one("huge_result")["error_msg"]
    assert one("nul_message")["status"] == "retry"
    assert "\x00" not in one("nul_message")["error_msg"]
    # NaN means "no Retry-After": the backoff's 30 s.
    assert one("nul_message")["scheduled_for"] - started < timedelta(seconds=40)
    assert one("huge_retry")["status"] == "retry"
    assert one("huge_retry")["scheduled_for"] - started <= timedelta(seconds=RETRY_MAX_S + 60)
    assert one("bad_defer")["status"] == "pending"
    assert one("bad_defer")["scheduled_for"] - started <= timedelta(seconds=DEFER_MAX_S + 60)
    assert one("bad_progress")["status"] == "completed"
    progress = one("bad_progress")["progress"]
    assert progress["percent"] == 100.0 and len(progress["message"]) <= 500


@given(st.one_of(st.text(max_size=40), st.none(), st.binary(max_size=20).map(repr)))
def test_retry_after_parser_never_raises_and_is_capped(value: str | None) -> None:
    seconds = parse_retry_after(value)
    assert seconds is None or (math.isfinite(seconds) and 0 <= seconds <= RETRY_MAX_S)


@given(
    st.one_of(
        st.integers(min_value=-(10**30), max_value=10**30).map(str),
        st.floats(allow_nan=True, allow_infinity=True).map(str),
        st.datetimes(timezones=st.just(UTC)).map(lambda d: d.strftime("%a, %d %b %Y %H:%M:%S GMT")),
    )
)
def test_retry_after_numbers_and_dates(value: str) -> None:
    seconds = parse_retry_after(value)
    assert seconds is None or (math.isfinite(seconds) and 0 <= seconds <= RETRY_MAX_S)
    if value.isdigit():  # a delta: itself, or the cap
        assert seconds == min(float(value), RETRY_MAX_S)


def test_a_retry_after_date_is_read_against_the_answers_own_date() -> None:
    """A service whose clock is two days behind asks for two minutes: before, its date was in
    this machine's past, so the job was retried at once (0 s)."""
    sent = datetime.now(UTC).replace(microsecond=0) - timedelta(days=2)
    later = format_datetime(sent + timedelta(seconds=120), usegmt=True)
    answer = httpx.Response(503, headers={"Date": format_datetime(sent, usegmt=True)})
    answer.headers["Retry-After"] = later
    assert retry_after_s(answer) == 120
    # With no Date header, or one that is no date, this machine's clock: in the past.
    assert retry_after_s(httpx.Response(503, headers={"Retry-After": later})) == 0
    garbled = httpx.Response(503, headers={"Date": "yesterday", "Retry-After": later})
    assert retry_after_s(garbled) == 0


def test_retry_after_examples() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert parse_retry_after("120") == 120
    assert parse_retry_after("Thu, 01 Jan 2026 00:02:00 GMT", now) == 120
    assert parse_retry_after("Wed, 31 Dec 2025 00:00:00 GMT", now) == 0  # in the past
    assert parse_retry_after("Fri, 31 Dec 9999 23:59:59 GMT", now) == RETRY_MAX_S
    assert parse_retry_after("99999999999999999999") == RETRY_MAX_S
    for garbage in ("-5", "nan", "inf", "1e9", "soon", "", "0x10", "Mon", "١٢"):
        assert parse_retry_after(garbage) is None, garbage


@given(
    st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.integers(min_value=-(10**400), max_value=10**400),
        st.none(),
        st.text(max_size=5),
        st.booleans(),
    )
)
def test_clamps_give_a_finite_delay_within_the_caps(value: Any) -> None:
    delay = clamp_s(value, RETRY_MAX_S)
    assert delay is None or (math.isfinite(delay) and 0 <= delay <= RETRY_MAX_S)
    after = RetryJob("x", after_s=value).after_s
    assert after is None or 0 <= after <= RETRY_MAX_S
    now = datetime.now(UTC)
    until = defer_until(value, None, now)
    assert now <= until <= now + timedelta(seconds=DEFER_MAX_S)
    job = ClaimedJob(UUID(int=1), UUID(int=2), "t", {}, 0, 1, 3, value)
    timeout = timeout_for(job, None, 60.0)
    assert 0 < timeout <= 60.0


@given(st.datetimes(timezones=st.just(UTC)) | st.datetimes())
def test_defer_until_is_capped_and_aware(until: datetime) -> None:
    now = datetime.now(UTC)
    when = defer_until(None, until, now)
    assert when.tzinfo is not None and when <= now + timedelta(seconds=DEFER_MAX_S)


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--lease", "nan"),
        ("--lease", "1e999"),
        ("--poll-interval", "inf"),
        ("--grace", "1e400"),
        ("--keep-errors", "99999999999d"),
    ],
)
def test_duration_settings_must_be_finite_and_bounded(flag: str, value: str) -> None:
    args = build_parser().parse_args(["run", flag, value])
    # NaN and exponents are no durations; a number past the bound names the bound.
    with pytest.raises(UserError, match=f"{flag} .*(bad duration|must be)"):
        settings.load(settings.given_flags(args))


async def test_big_payloads_stay_out_of_the_claim_and_over_the_cap_fail_alone(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """Any plain-SQL insert can write a payload of hundreds of megabytes. A claim carries only
    small payloads; a bigger one is read alone when its job runs, and one over the cap (giant
    or compressed from giant) fails its own job without reaching the worker's memory."""
    big = "y" * 300_000  # compressed in storage: left behind, read alone, runs
    await pool.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload) VALUES"
        " ($1, 'noop', '{\"name\": \"small\"}'),"
        " ($1, 'noop', jsonb_build_object('name', 'big', 'text', $2::text)),"
        " ($1, 'noop', jsonb_build_object('name', 'random', 'text',"
        "   (SELECT string_agg(md5(g::text), '') FROM generate_series(1, 2000) g))),"
        " ($1, 'noop', jsonb_build_object('name', 'giant', 'text', repeat('z', 60000000))),"
        " ($1, 'noop', jsonb_build_object('name', 'over', 'text', repeat('q', $3::int)))",
        workspace,
        big,
        MAX_PAYLOAD_BYTES,
    )
    worker_id = UUID(int=98)
    await store.register_worker(pool, worker_id, "test", 1, None, 60)
    async with pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        try:  # the claim is rolled back; the jobs run below
            claimed = await store.claim(conn, worker_id, 10, ["noop"])
            names = await conn.fetch(
                "SELECT id, payload->>'name' AS name FROM job_queue WHERE id = ANY($1)",
                [j.id for j in claimed],
            )
        finally:
            await tx.rollback()
    carried = {r["name"]: next(j.payload for j in claimed if j.id == r["id"]) for r in names}
    assert carried == {"small": {"name": "small"}} | dict.fromkeys(
        ("big", "random", "giant", "over")
    )

    await run_burst(pool, db_url)
    rows = {
        r["name"]: r
        for r in await pool.fetch(
            "SELECT payload->>'name' AS name, status::text AS st, attempts, error_msg,"
            " result->>'text' AS text FROM job_queue"
        )
    }
    assert {n: r["st"] for n, r in rows.items()} == {
        "small": "completed",
        "big": "completed",
        "random": "completed",
        "giant": "error",
        "over": "error",
    }
    assert rows["big"]["text"] == big and len(rows["random"]["text"]) == 64_000
    for name in ("giant", "over"):
        assert rows[name]["attempts"] == 1
        assert f"over the cap of {MAX_PAYLOAD_BYTES:,}" in rows[name]["error_msg"]
    assert "payload of 60,000,0" in rows["giant"]["error_msg"]


async def test_a_json_null_payload_fails_as_not_an_object_not_as_over_the_cap(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """The claim's NULL for a payload it left behind and a payload that is JSON null both
    reach the executor as None; a null was read again and reported as a payload "over the
    cap" of 4 bytes. It fails for good, as a payload that is not what its type takes."""
    job = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload) VALUES ($1, 'noop', 'null')"
        " RETURNING id",
        workspace,
    )
    await run_burst(pool, db_url)
    row = await pool.fetchrow(
        "SELECT status::text, attempts, error_msg FROM job_queue WHERE id = $1", job
    )
    assert (row["status"], row["attempts"]) == ("error", 1)
    assert row["error_msg"] == "invalid payload: expected a JSON object, got NoneType"


async def test_extreme_row_values_written_by_sql_never_stop_the_claims(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """A claim computes from each row it takes: the attempt count (+1) and the wait (now minus
    scheduled_for). A row at smallint's top or due since -infinity once failed the whole
    statement, and so every claim of every worker, for as long as that one row was due."""
    ids = [
        await pool.fetchval(
            f"INSERT INTO job_queue (workspace_id, job_type, payload, {columns})"
            f" VALUES ($1, 'noop', '{{}}', {values}) RETURNING id",
            workspace,
        )
        for columns, values in (
            ("scheduled_for, created_at", "'-infinity', '-infinity'"),
            ("attempts, max_attempts", "32767, 32767"),
            ("attempts", "32767"),
            ("priority", "1"),
        )
    ]
    assert await store.oldest_due_s(pool) >= 0  # the dashboard's gauge, beside a -infinity row
    await run_burst(pool, db_url)
    rows = await pool.fetch(
        "SELECT id, status::text AS st, attempts FROM job_queue WHERE id = ANY($1)", ids
    )
    assert {r["id"]: (r["st"], r["attempts"]) for r in rows} == {
        ids[0]: ("completed", 1),
        ids[1]: ("completed", 32767),
        ids[2]: ("completed", 32767),
        ids[3]: ("completed", 1),
    }
    # The admin's retry gives one more attempt, here as far as the column goes.
    await pool.execute("UPDATE job_queue SET status = 'error' WHERE id = $1", ids[1])
    async with pool.acquire() as conn:
        assert await admin_store.retry_job(conn, ids[1])


async def test_the_error_history_stops_growing_at_a_megabyte(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """Every recorded failure is appended to `errors` while the history is stored in at most
    1 MB: a history some plain-SQL writer made huge (near jsonb's 255 MB, an append fails the
    statement) must not fail the batch it is in, nor the rescue of every dead worker's jobs."""
    huge, plain = [
        await pool.fetchval(
            "INSERT INTO job_queue (workspace_id, job_type, payload, max_attempts, errors)"
            " VALUES ($1, 'noop', '{\"fail_permanent\": \"no\"}', 1, $2) RETURNING id",
            workspace,
            history,
        )
        for history in (
            [uuid4().hex + uuid4().hex for _ in range(20_000)],  # 1.3 MB that do not compress
            [],
        )
    ]
    await run_burst(pool, db_url)
    rows = {
        r["id"]: r
        for r in await pool.fetch(
            "SELECT id, status::text AS st, error_msg, jsonb_array_length(errors) AS n"
            " FROM job_queue"
        )
    }
    assert (rows[huge]["st"], rows[huge]["error_msg"], rows[huge]["n"]) == ("error", "no", 20_000)
    assert (rows[plain]["st"], rows[plain]["n"]) == ("error", 1)


async def test_json_nested_past_the_decoder_s_depth_fails_its_job_at_once(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """PostgreSQL stores JSON nested far deeper than orjson's 1,024 levels. Such a value is
    decoded as a string saying so instead of raising: its payload fails its job permanently at
    once (it was retried as a transient fault), and a page or query reading it never fails."""
    deep = "[" * 1100 + "]" * 1100
    deep_id, plain_id = [
        await pool.fetchval(
            "INSERT INTO job_queue (workspace_id, job_type, payload)"
            " VALUES ($1, 'noop', $2::text::jsonb) RETURNING id",
            workspace,
            payload,
        )
        for payload in (f'{{"x": {deep}}}', "{}")
    ]
    await run_burst(pool, db_url)
    rows = {
        r["id"]: r
        for r in await pool.fetch(
            "SELECT id, status::text AS st, attempts, error_msg FROM job_queue"
        )
    }
    assert (rows[deep_id]["st"], rows[deep_id]["attempts"]) == ("error", 1)
    assert "invalid payload: JSON this worker cannot read" in rows[deep_id]["error_msg"]
    assert rows[plain_id]["st"] == "completed"
    async with pool.acquire() as conn:
        shown = await admin_store.get_job(conn, deep_id)
    assert shown is not None and "cannot read" in shown["payload"]


async def test_a_running_row_no_worker_holds_is_rescued_whatever_its_start(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """A `running` row without a worker row is left alone while it started within the last
    lease (a claim that raced its worker's end). One whose start no claim writes (in the
    future, 'infinity': any plain-SQL writer's) was left alone for ever, holding a slot of its
    type's cap: with a cap of 1, no job of that type ran again, in any workspace."""
    other = await make_workspace(pool, "other")
    await pool.execute("INSERT INTO job_type_limits (job_type, max_running) VALUES ('noop', 1)")
    forged = [
        await pool.fetchval(
            "INSERT INTO job_queue (workspace_id, job_type, payload, status, worker_id,"
            f" started_at) VALUES ($1, 'noop', '{{}}', 'running', {worker}, {started})"
            " RETURNING id",
            workspace,
        )
        for worker, started in (
            ("NULL", "'infinity'"),
            ("gen_random_uuid()", "now() + interval '1 day'"),
        )
    ]
    theirs = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload) VALUES ($1, 'noop', '{}')"
        " RETURNING id",
        other,
    )
    await asyncio.wait_for(run_burst(pool, db_url), 20)
    rows = await pool.fetch("SELECT id, status::text AS st FROM job_queue")
    assert {r["id"]: r["st"] for r in rows} == {i: "completed" for i in (*forged, theirs)}


async def test_an_outcome_whose_statement_outlasts_its_timeout_is_written_with_more_time(
    pool: asyncpg.Pool, workspace: UUID
) -> None:
    """A completion's statement also settles the job's graph children: a parent of 300,000
    children outlasts the statements' timeout. With a fixed timeout it failed at every try and
    every outcome behind it waited for ever (the heartbeat keeping the jobs from the rescue).
    Here a trigger makes one completion take 0.3 s against a timeout of 0.1 s."""
    worker_id, ids = await _claimed(pool, workspace, 3)
    await pool.execute(
        "CREATE FUNCTION test_slow_completion() RETURNS trigger LANGUAGE plpgsql AS"
        " $$ BEGIN PERFORM pg_sleep(0.3); RETURN NULL; END $$;"
        " CREATE TRIGGER test_slow_completion AFTER UPDATE ON job_queue FOR EACH ROW"
        " WHEN (NEW.status = 'completed' AND NEW.payload ? 'slow')"
        " EXECUTE FUNCTION test_slow_completion()"
    )
    await pool.execute("UPDATE job_queue SET payload = '{\"slow\": true}' WHERE id = $1", ids[0])
    writer = OutcomeWriter(pool, worker_id, timeout_s=0.1)
    task = asyncio.create_task(writer.run())
    try:
        for job_id in ids:
            writer.completed(job_id, RawJson(b"{}"))
        assert await writer.drain(20)
    finally:
        task.cancel()
    statuses = await pool.fetch("SELECT status::text FROM job_queue WHERE id = ANY($1)", ids)
    assert [r[0] for r in statuses] == ["completed"] * 3


async def test_a_rescue_that_outlasts_its_timeout_is_tried_with_more_time(
    pool: asyncpg.Pool, workspace: UUID
) -> None:
    """The rescue is one statement for every dead worker's jobs, and ending a job's last attempt
    cancels its graph children in it too: with a fixed timeout, such a rescue timed out at every
    turn and no dead worker's job came back. A trigger makes it take 0.3 s against 0.1 s."""
    worker_id, ids = await _claimed(pool, workspace, 2)
    await pool.execute(
        "CREATE FUNCTION test_slow_rescue() RETURNS trigger LANGUAGE plpgsql AS"
        " $$ BEGIN PERFORM pg_sleep(0.3); RETURN NULL; END $$;"
        " CREATE TRIGGER test_slow_rescue AFTER UPDATE ON job_queue FOR EACH ROW"
        " WHEN (NEW.status = 'retry' AND NEW.payload ? 'slow')"
        " EXECUTE FUNCTION test_slow_rescue()"
    )
    await pool.execute("UPDATE job_queue SET payload = '{\"slow\": true}' WHERE id = $1", ids[0])
    await pool.execute(
        "UPDATE job_workers SET expires_at = now() - interval '1 minute' WHERE id = $1", worker_id
    )
    loop = asyncio.create_task(
        maintenance.rescue_loop(pool, WorkerSettings(poll_interval_s=0.05), timeout_s=0.1)
    )
    try:
        await wait_for_sql(
            pool,
            "SELECT count(*) = 2 FROM job_queue WHERE status = 'retry' AND id = ANY($1)",
            ids,
            timeout_s=20,
        )
    finally:
        loop.cancel()


async def test_a_flush_that_fails_across_a_discard_is_not_tried_under_the_next_worker_id(
    pool: asyncpg.Pool, workspace: UUID
) -> None:
    """A worker declared dead discards its buffered outcomes and comes back under a new id. An
    outcome whose flush was in flight then, and failed (a lost connection, a timeout), went
    back to the buffers and was written under the new id: had the new worker claimed the same
    job meanwhile, the old run's result completed the new run's job. Here a trigger holds the
    completion past the writer's timeout while the worker is declared dead and its job is
    claimed again under the new id."""
    old_id, ids = await _claimed(pool, workspace, 1)
    new_id = uuid4()
    await pool.execute(
        "CREATE FUNCTION test_slow_completion() RETURNS trigger LANGUAGE plpgsql AS"
        " $$ BEGIN PERFORM pg_sleep(1); RETURN NULL; END $$;"
        " CREATE TRIGGER test_slow_completion AFTER UPDATE ON job_queue FOR EACH ROW"
        " WHEN (NEW.status = 'completed') EXECUTE FUNCTION test_slow_completion()"
    )
    writer = OutcomeWriter(pool, old_id, timeout_s=0.3)
    task = asyncio.create_task(writer.run())
    try:
        writer.completed(ids[0], RawJson(b'{"run": "old"}'))
        await wait_for_sql(
            pool,
            "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE wait_event = 'PgSleep'"
            " AND datname = current_database())",
            timeout_s=10,
        )
        writer.discard()  # what Worker._declared_dead does, then a new id
        writer.worker_id = new_id
        # The rescue and the new incarnation's claim, once the timed-out completion is gone;
        # the trigger goes with them, so a write under the new id would go through.
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute("DROP TRIGGER test_slow_completion ON job_queue")
            await conn.execute(
                "UPDATE job_queue SET worker_id = $2 WHERE id = $1 AND status = 'running'",
                ids[0],
                new_id,
            )
        # Until the flush that failed has ended and nothing is left to write or on its way.
        await wait_for(lambda: not writer.unwritten() and not writer._arrived.is_set(), 10)
    finally:
        task.cancel()
    row = await pool.fetchrow("SELECT status::text, worker_id FROM job_queue WHERE id = $1", ids[0])
    assert (row["status"], row["worker_id"]) == ("running", new_id)


@pytest.mark.parametrize("fault", ["lock_timeout", "read_only"])
async def test_a_database_that_cannot_take_a_write_now_is_not_a_refused_value(
    pool: asyncpg.Pool,
    db_url: str,
    workspace: UUID,
    fault: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A lock timeout (a role's or database's `lock_timeout` while the web app holds the row)
    and a server that takes no writes (a standby that a failover left the connection on) were
    taken for values PostgreSQL refuses: the outcome was written row by row, then its job's
    error, each refused again, and the result was dropped, the job left to the lease rescue to
    run again. They are the database's state, not the outcome's: the writer tries again until
    the write goes through, as when the database is away."""
    worker_id, ids = await _claimed(pool, workspace, 1)
    setting = {"lock_timeout": "100ms"} if fault == "lock_timeout" else {}
    if fault == "read_only":
        setting = {"default_transaction_read_only": "on"}
    faulty = await asyncpg.create_pool(
        db_url, min_size=1, max_size=1, init=init_connection, server_settings=setting
    )
    holder = await pool.acquire()
    writer = OutcomeWriter(faulty, worker_id)
    task = asyncio.create_task(writer.run())
    try:
        if fault == "lock_timeout":  # the web app's transaction holds the job's row
            await holder.execute("BEGIN")
            await holder.execute("SELECT FROM job_queue WHERE id = $1 FOR UPDATE", ids[0])
        writer.completed(ids[0], RawJson(b'{"kept": true}'))
        await wait_for(
            lambda: sum(r.name == "sidelinja_worker.outcomes" for r in caplog.records) >= 2,
            what="two writes fail",
        )
        if fault == "lock_timeout":
            await holder.execute("COMMIT")
        else:  # the failover is over: new connections reach the primary
            writer.use_pool(pool)
        assert await writer.drain(20)
    finally:
        task.cancel()
        await pool.release(holder)
        await faulty.close()
    row = await pool.fetchrow("SELECT status::text, result FROM job_queue WHERE id = $1", ids[0])
    assert (row["status"], row["result"]) == ("completed", {"kept": True})


async def test_a_job_row_locked_by_another_session_holds_up_no_other_outcome(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """Any role may lock its own rows, and the web app's transaction may be left open on its
    job: the batch statement that wrote every workspace's outcomes waited on that one row, so
    the others stayed `running` for as long as the lock lasted (and at a stop were lost, their
    jobs run again). The batch now waits pools.LOCK_WAIT_S, the others are written one by one,
    and the locked job's outcome waits alone until its row is free."""
    worker_id, ids = await _claimed(pool, workspace, 6)
    locked, others = ids[0], ids[1:]
    writer_pool = await asyncpg.create_pool(
        db_url, min_size=1, max_size=1, init=init_connection, server_settings=pools.OWN_SESSIONS
    )
    holder = await pool.acquire()
    writer = OutcomeWriter(writer_pool, worker_id)
    task = asyncio.create_task(writer.run())
    try:
        await holder.execute("BEGIN")
        await holder.execute("SELECT FROM job_queue WHERE id = $1 FOR UPDATE", locked)
        for job_id in ids:
            writer.completed(job_id, RawJson(b'{"done": true}'))
        await wait_for(
            lambda: pool.fetchval(
                "SELECT count(*) = $2 FROM job_queue WHERE id = ANY($1) AND status = 'completed'",
                others,
                len(others),
            ),
            6,
            "the other jobs completed while the row stays locked",
        )
        assert locked in writer.owned_ids()
        await holder.execute("COMMIT")
        assert await writer.drain(10)
    finally:
        task.cancel()
        await pool.release(holder)
        await writer_pool.close()
    assert await pool.fetchval("SELECT status::text FROM job_queue WHERE id = $1", locked) == (
        "completed"
    )


async def test_a_payload_of_countless_arrays_fails_its_job_undecoded(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """A payload within the byte cap made of arrays (4 MB of `[]`: 1.4 million of them) was
    decoded on the event loop, holding it 0.8-5 s a job: every other job, claim and heartbeat
    waited. Arrays and objects are counted in the database first; past the cap the job fails
    for good, undecoded, and a payload under it runs."""
    await pool.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload) VALUES"
        " ($1, 'noop', jsonb_build_object('name', 'many',"
        "   'list', ('[' || repeat('[],', $2::int) || '[]]')::jsonb)),"
        " ($1, 'noop', jsonb_build_object('name', 'some',"
        "   'list', ('[' || repeat('[],', 50000) || '[]]')::jsonb))",
        workspace,
        MAX_PAYLOAD_CONTAINERS,
    )
    await run_burst(pool, db_url)
    rows = {
        r["name"]: r
        for r in await pool.fetch(
            "SELECT payload->>'name' AS name, status::text AS st, error_msg FROM job_queue"
        )
    }
    assert rows["some"]["st"] == "completed", rows["some"]["error_msg"]
    assert rows["many"]["st"] == "error"
    assert f"over the cap of {MAX_PAYLOAD_CONTAINERS:,}" in rows["many"]["error_msg"]
