"""The admin app against one hostile or absurd value: a form, a query parameter, a row written by
plain SQL, many stream clients. Each must get a clear 4xx or a bounded answer, never a 500, a
page of unbounded size or a process that holds unbounded memory."""

from __future__ import annotations

import re

import asyncpg
import httpx

from sidelinja_worker.admin import app as admin_app
from sidelinja_worker.admin import auth, dashboard
from sidelinja_worker.queue.store import OTHER_TYPES
from tests.admin_fixtures import (  # noqa: F401 (fixture)
    admin_fixture,
    seed,
    workspace_bearer,
)


async def test_every_form_is_read_only_up_to_a_few_short_fields(
    pool: asyncpg.Pool, db_url: str, admin: str
) -> None:
    """Every form was read with Starlette's own bounds (1,000 fields of 1 MB, files spooled to
    disk), logout's for any cookie whatever its value, before any check: one such request made
    the server hold a gigabyte. A form is a CSRF value and a few short fields: a field over
    admin_app.FORM_FIELD_MAX bytes, more than admin_app.FORM_FIELDS_MAX fields, or a file is a
    400, from anyone."""
    a, _b, _ = await seed(pool)
    job = await pool.fetchval("SELECT id FROM job_queue WHERE workspace_id = $1 LIMIT 1", a)
    headers = workspace_bearer(db_url, a)
    forms = (
        {"csrf": "x", "f": "x" * (admin_app.FORM_FIELD_MAX + 1)},
        {f"f{i}": "x" for i in range(admin_app.FORM_FIELDS_MAX + 1)},
    )
    async with httpx.AsyncClient(base_url=admin) as http:
        for form in forms:
            junk_cookie = await http.post(
                "/admin/logout", data=form, headers={"cookie": f"{auth.COOKIE}=x"}
            )
            assert junk_cookie.status_code == 400, junk_cookie.status_code
            for path in (f"/admin/jobs/{job}/retry", "/admin/jobs/bulk-retry", "/admin/pauses/x"):
                refused = await http.post(path, data=form, headers=headers)
                assert refused.status_code == 400, (path, refused.status_code)
        upload = await http.post(
            "/admin/logout", files={"csrf": ("c", b"x")}, headers={"cookie": f"{auth.COOKIE}=x"}
        )
        assert upload.status_code == 400, upload.status_code


async def test_a_payload_search_for_any_number_is_a_page_never_a_500(
    pool: asyncpg.Pool, db_url: str, admin: str
) -> None:
    """A number in the payload search became a Python float: 400 digits became inf, sent to the
    database as `Infinity`, which is no JSON (a 500, on the list and on a bulk retry alike). A
    number is searched for as typed (jsonb compares numbers of any size exactly); one longer
    than forms.NUMBER_MAX characters, which PostgreSQL's numeric may not hold, or digits other
    than 0-9, as text."""
    a, _b, _ = await seed(pool)
    huge = "1" + "0" * 400 + ".5"
    wanted = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload, status)"
        " VALUES ($1, 'noop', jsonb_build_object('n', $2::numeric), 'error') RETURNING id",
        a,
        huge,
    )
    headers = {**workspace_bearer(db_url, a), "sec-fetch-site": "same-origin"}
    csrf = auth.csrf_for(headers["authorization"].removeprefix("Bearer "))
    async with httpx.AsyncClient(base_url=admin, headers=headers) as http:
        for value, listed in ((huge, [str(wanted)]), ("\u0663", []), ("-0.5", [])):
            page = await http.get("/admin/jobs", params={"status": "all", "payload": f"n={value}"})
            assert page.status_code == 200, (value[:20], page.status_code)
            assert re.findall(r'<tr data-job="([0-9a-f-]{36})"', page.text) == listed
            assert 'id="next"' not in page.text
        for value, retried in (("1." + "1" * 20_000, 0), (huge, 1)):
            form = {"csrf": csrf, "status": "error", "payload": f"n={value}"}
            sent = await http.post("/admin/jobs/bulk-retry", data=form)
            assert sent.status_code == 303, (value[:20], sent.status_code)
            assert f"retried={retried}" in sent.headers["location"]


async def test_the_dashboard_names_only_the_most_numerous_waiting_job_types(
    pool: asyncpg.Pool, db_url: str, admin: str
) -> None:
    """The dashboard gave each waiting job type a row, a day of per-minute figures and a chart:
    20,000 waiting jobs of as many types (any plain-SQL writer may enqueue them) made it 36 MB,
    7.5 s and 540 MB of the admin process's memory. Past the dashboard.TYPES_MAX types with
    the most waiting jobs, the rest are one row, counted together."""
    a, _b, _ = await seed(pool)
    await pool.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload)"
        " SELECT $1::uuid, 'type-' || g, '{}'::jsonb FROM generate_series(1, 2000) g"
        " UNION ALL SELECT $1::uuid, 'busy', '{}'::jsonb FROM generate_series(1, 3)",
        a,
    )
    async with httpx.AsyncClient(base_url=admin, headers=workspace_bearer(db_url, a)) as http:
        page = await http.get("/admin/dashboard")
    assert page.status_code == 200
    assert len(page.content) < 400_000, len(page.content)
    assert 'data-type="busy"' in page.text and f'data-type="{OTHER_TYPES}"' in page.text
    assert page.text.count("<tr data-type=") == dashboard.TYPES_MAX + 1
    assert '<strong id="depth">2003</strong>' in page.text
