"""The admin view's pages in real headless Chromium with the longest values a plain-SQL writer can
give them: each page stays as wide as the window, its tables wrapping what does not fit."""

from __future__ import annotations

import asyncpg

from sidelinja_worker.queue import store
from tests.admin_fixtures import admin_fixture, token_for  # noqa: F401 (fixture)
from tests.helpers import make_workspace
from tests.test_admin_browser import browser, logged_in, pytestmark  # noqa: F401

WIDTH = 1280
# Text without a place to break a line, as long as the pages read it (store.TEXT_SHOWN).
LONG = "x" * 512


async def test_no_page_is_wider_than_the_window_whatever_its_values(
    pool: asyncpg.Pool,
    db_url: str,
    admin: str,
    browser: object,  # noqa: F811
) -> None:
    """A job type, a unique key, an error, a workspace name, a pause's reason or a worker's host
    of 512 characters without a space made each page several thousand pixels wide: a table
    cell is as wide as its longest word, and the columns beside it (the job's status, its
    error) were squeezed to a few letters a line. Every page now fits a 1,280-pixel window."""
    ws = await make_workspace(pool, "Workspace" + LONG)
    job = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload, unique_key, status, attempts,"
        " error_msg, errors, completed_at) VALUES ($1, $2, '{}', $2, 'error', 1, $2,"
        " jsonb_build_array(jsonb_build_object('attempt', 1, 'at', now(), 'class', $2::text,"
        " 'message', $2::text)), now()) RETURNING id",
        ws,
        "t" + LONG,
    )
    child = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload) VALUES ($1, $2, '{}')"
        " RETURNING id",
        ws,
        "c" + LONG,
    )
    done = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload) VALUES ($1, 'noop', '{}')"
        " RETURNING id",
        ws,
    )
    await pool.execute(
        "INSERT INTO job_dependencies (parent_id, child_id, run_anyway)"
        " VALUES ($1, $2, false), ($1, $3, true)",
        job,
        child,
        done,
    )
    await pool.execute("UPDATE job_queue SET status = 'completed' WHERE id = $1", done)
    await pool.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload) VALUES ($1, $2, '{}')",
        ws,
        "p" + LONG,
    )
    await pool.execute(
        "INSERT INTO job_type_pauses (job_type, paused_by, reason) VALUES ($1, $1, $1)",
        "c" + LONG,
    )
    worker = await pool.fetchval("SELECT gen_random_uuid()")
    await store.register_worker(pool, worker, "h" + LONG, 1, ["v" + LONG], 600, "0" + LONG, 1)
    page = await logged_in(browser, admin, token_for(db_url, "--all"))
    await page.set_viewport_size({"width": WIDTH, "height": 800})  # type: ignore[attr-defined]
    for path in (
        "/admin",
        "/admin/jobs?status=all",
        f"/admin/jobs/{job}",
        f"/admin/jobs/{job}/graph",
        "/admin/dashboard",
        "/admin/workers",
    ):
        await page.goto(admin + path)  # type: ignore[attr-defined]
        assert LONG[:500] in await page.content(), path  # type: ignore[attr-defined]
        width = await page.evaluate("document.documentElement.scrollWidth")  # type: ignore[attr-defined]
        assert width <= WIDTH, (path, width)
    # A graph node's lines stay inside its box: the status and short id (store.short_id) of a
    # completed or cancelled job are its longest.
    await page.goto(f"{admin}/admin/jobs/{job}/graph")  # type: ignore[attr-defined]
    overflow = await page.evaluate(  # type: ignore[attr-defined]
        """[...document.querySelectorAll('#graph g.node')].flatMap(g => {
            const box = g.querySelector('rect').getBBox();
            return [...g.querySelectorAll('text')].map(t => t.getBBox())
                .filter(t => t.x + t.width > box.x + box.width - 4)
                .map(t => g.textContent.trim());
        })"""
    )
    assert overflow == [], overflow
