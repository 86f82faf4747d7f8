"""The admin app against one hostile or absurd value: a form, a query parameter, a row written by
plain SQL, many stream clients. Each must get a clear 4xx or a bounded answer, never a 500, a
page of unbounded size or a process that holds unbounded memory."""

from __future__ import annotations

import asyncpg
import httpx

from sidelinja_worker.admin import app as admin_app
from sidelinja_worker.admin import auth
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
