"""`workspace create` as a user meets it: an id already taken, a name left empty."""

from __future__ import annotations

from uuid import UUID

import asyncpg

from tests.helpers import cli, one_line_error


async def test_an_id_already_taken_says_the_workspace_is_kept_as_it_is(
    db_url: str, pool: asyncpg.Pool, workspace: UUID
) -> None:
    name = await pool.fetchval("SELECT name FROM workspaces WHERE id = $1", workspace)
    out = cli("workspace", "create", "Another", "--id", str(workspace), url=db_url)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(workspace)  # a script that reruns it still gets the id
    said = [ln for ln in out.stderr.splitlines() if not ln.startswith("sidelinja-worker: using")]
    assert said == [
        f"sidelinja-worker: workspace {workspace} already exists, named {name!r}; left as it is"
    ]
    assert await pool.fetchval("SELECT name FROM workspaces WHERE id = $1", workspace) == name


async def test_an_empty_name_is_refused(db_url: str, pool: asyncpg.Pool) -> None:
    out = cli("workspace", "create", "  ", url=db_url)
    assert one_line_error(out) == "sidelinja-worker: error: NAME must not be empty"
    assert await pool.fetchval("SELECT count(*) FROM workspaces") == 0
