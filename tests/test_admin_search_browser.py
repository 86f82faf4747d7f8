"""Finding a job in the admin view, driven in real headless Chromium: the Jobs page's search form
by id prefix, job type, status, time window and payload field, with two workspaces. A workspace
token's search never shows the other workspace's jobs; the platform admin's sees both."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from urllib.parse import urlencode
from uuid import UUID

import asyncpg

from tests.admin_fixtures import admin_fixture, seed, token_for  # noqa: F401 (fixture)
from tests.test_admin_browser import (  # noqa: F401 (fixture)
    browser,
    logged_in,
    pytestmark,  # skipped where Debian's Chromium is missing
    row_ids,
    shot,
)


async def _job(
    pool: asyncpg.Pool,
    workspace: UUID,
    job_type: str,
    status: str,
    episode: int,
    age: timedelta = timedelta(0),
) -> str:
    job_id: UUID = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload, status, attempts, error_msg,"
        " created_at, completed_at)"
        " VALUES ($1, $2, jsonb_build_object('episode_id', $3::int), $4::job_status,"
        "         1, CASE WHEN $4 = 'error' THEN 'whisper: HTTP 503' END, now() - $5::interval,"
        "         CASE WHEN $4 IN ('completed', 'error') THEN now() - $5::interval END)"
        " RETURNING id",
        workspace,
        job_type,
        episode,
        status,
        age,
    )
    return str(job_id)


def _minute(at: datetime) -> str:
    """A From or To value, as ISO 8601 to the minute; the view reads times without a zone as
    UTC."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M")


async def _search(page: object, **fields: str) -> set[str]:
    """Fills the search form as a user does (empty string clears a field), submits it and
    returns the ids of the rows shown."""
    selects = {"status": "#f-status", "workspace": "#f-workspace"}
    inputs = {"type": "#f-type", "id": "#f-id", "payload": "#f-payload"}
    inputs |= {"from": "input[name=from]", "to": "input[name=to]"}
    for name, value in fields.items():
        if name in selects:
            await page.select_option(selects[name], value)  # type: ignore[attr-defined]
        else:
            await page.fill(inputs[name], value)  # type: ignore[attr-defined]
    async with page.expect_navigation():  # type: ignore[attr-defined]
        await page.click("#apply")  # type: ignore[attr-defined]
    return await row_ids(page)


CLEAR = {"type": "", "id": "", "payload": "", "from": "", "to": ""}


async def test_search_form_in_chromium_with_two_workspaces(
    pool: asyncpg.Pool,
    db_url: str,
    admin: str,
    browser: object,  # noqa: F811 (the fixture imported above)
) -> None:
    a, b, b_seeded = await seed(pool)
    a42 = await _job(pool, a, "whisper_transcribe", "error", 42)
    a42_done = await _job(pool, a, "srt_parse", "completed", 42)
    a43 = await _job(pool, a, "whisper_transcribe", "error", 43)
    a42_old = await _job(pool, a, "whisper_transcribe", "error", 42, timedelta(days=3))
    b42 = await _job(pool, b, "whisper_transcribe", "error", 42)
    b42_pending = await _job(pool, b, "srt_parse", "pending", 42)
    in_a = {
        r[0] for r in await pool.fetch("SELECT id::text FROM job_queue WHERE workspace_id = $1", a)
    }
    in_b = {
        r[0] for r in await pool.fetch("SELECT id::text FROM job_queue WHERE workspace_id = $1", b)
    }
    now = datetime.now(UTC)

    # The platform admin: both workspaces.
    page = await logged_in(browser, admin, token_for(db_url, "--all"))
    found = await _search(page, status="all", payload="episode_id=42")
    assert found == {a42, a42_done, b42, b42_pending}  # a day back by default: not a42_old
    await shot(page, "admin-search.png")
    assert await _search(page, status="error") == {a42, b42}
    assert await _search(page, status="all", type="srt_parse") == {a42_done, b42_pending}
    assert await _search(page, type="", workspace=str(b)) == {b42, b42_pending}
    older = _minute(now - timedelta(days=4))
    assert await _search(page, workspace="", **{"from": older}) == {
        a42,
        a42_done,
        a42_old,
        b42,
        b42_pending,
    }
    window = {"from": older, "to": _minute(now - timedelta(days=2))}
    assert await _search(page, **window) == {a42_old}
    # A link whose window has a zone: the form shows it in UTC, to the second, so a second
    # search keeps it whole (cut to the minute, it lost up to a minute of the window).
    link_from = (now - timedelta(days=4)).astimezone(timezone(timedelta(hours=2)))
    query = urlencode({"status": "all", "payload": "episode_id=42", "from": link_from.isoformat()})
    await page.goto(f"{admin}/admin/jobs?{query}")  # type: ignore[attr-defined]
    shown = link_from.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S")
    assert await page.input_value("input[name=from]") == shown  # type: ignore[attr-defined]
    assert await _search(page, type="whisper_transcribe") == {a42, a42_old, b42}
    assert urlencode({"from": shown}) in page.url  # type: ignore[attr-defined]
    assert await _search(page, **{**CLEAR, "status": "all", "id": a43[:8]}) == {a43}
    assert await _search(page, id=a43[:13], payload="episode_id=43") == {a43}
    assert await _search(page, id=a43[:8], payload="episode_id=42") == set()
    assert await _search(page, **CLEAR) == in_a | in_b

    # A token for workspace A: the same searches never show B's jobs, whatever is asked.
    page = await logged_in(browser, admin, token_for(db_url, "--workspace", str(a)))
    assert await page.locator("#f-workspace").count() == 0  # type: ignore[attr-defined]
    assert await _search(page, status="all", payload="episode_id=42") == {a42, a42_done}
    assert await _search(page, **CLEAR) == in_a
    assert await _search(page, id=b42[:8]) == set()
    assert await _search(page, id=str(b_seeded)[:13]) == set()
    srt = {
        r[0]
        for r in await pool.fetch("SELECT id::text FROM job_queue WHERE job_type = 'srt_parse'")
    }
    assert await _search(page, id="", type="srt_parse") == in_a & srt
    await page.goto(f"{admin}/admin/jobs?status=all&workspace={b}&payload=episode_id%3D42")  # type: ignore[attr-defined]
    assert await row_ids(page) == {a42, a42_done}  # a hand-made URL naming B changes nothing

    # And a token for B sees only B's.
    page = await logged_in(browser, admin, token_for(db_url, "--workspace", str(b)))
    assert await _search(page, status="all", payload="episode_id=42") == {b42, b42_pending}
    assert await _search(page, **{**CLEAR, "id": a42[:8]}) == set()
    assert await _search(page, id="") == in_b


async def test_from_and_to_take_24_hour_utc_as_typed(
    pool: asyncpg.Pool,
    db_url: str,
    admin: str,
    browser: object,  # noqa: F811 (the fixture imported above)
) -> None:
    """From and To were the browser's date-time fields, which an en-US Chromium shows and takes
    in 12-hour time of no stated zone, and which refuse a time typed as the pages show one.
    They are text fields for ISO 8601 in 24-hour UTC: a time typed as the list shows it
    (`2026-12-07 14:05:00`) filters by it, and one that is no time is a 400 saying what to
    type."""
    a, _b, _ = await seed(pool)
    old = await _job(pool, a, "whisper_transcribe", "error", 42, timedelta(days=3))
    page = await logged_in(browser, admin, token_for(db_url, "--all"))
    for field in ("from", "to"):
        box = f"input[name={field}]"
        assert await page.get_attribute(box, "type") == "text"  # type: ignore[attr-defined]
        assert await page.get_attribute(box, "placeholder") == "YYYY-MM-DDTHH:MM:SS"  # type: ignore[attr-defined]
    at = (datetime.now(UTC) - timedelta(days=2)).strftime("%Y-%m-%d %H:%M:%S")
    assert await _search(page, status="all", to=at) == {old}
    assert await page.input_value("input[name=to]") == at.replace(" ", "T")  # type: ignore[attr-defined]
    async with page.expect_navigation():  # type: ignore[attr-defined]
        await page.fill("input[name=from]", "12/7/2026, 2:05 PM")  # type: ignore[attr-defined]
        await page.click("#apply")  # type: ignore[attr-defined]
    text = await page.inner_text("body")  # type: ignore[attr-defined]
    assert "from: '12/7/2026, 2:05 PM' is no time" in text and "YYYY-MM-DDTHH:MM:SS" in text


def test_the_screenshot_is_linked_from_the_operator_guide() -> None:
    docs = Path(__file__).resolve().parent.parent / "docs"
    assert "(admin-search.png)" in (docs / "operator.md").read_text(encoding="utf-8")
    assert (docs / "admin-search.png").stat().st_size > 10_000
