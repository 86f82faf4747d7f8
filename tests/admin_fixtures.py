"""The running admin app and seeded workspaces, shared by the admin HTTP and browser tests."""

from __future__ import annotations

import socket
from uuid import UUID

import asyncpg
import httpx
import pytest

from tests.helpers import cli, make_workspace, spawn, wait_for


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(name="admin")
async def admin_fixture(db_url: str) -> str:
    """`sidelinja-worker admin` as a real process; its base URL once it answers."""
    return await serve_admin(db_url)


async def serve_admin(db_url: str, env: dict[str, str] | None = None) -> str:
    """`sidelinja-worker admin` as a real process, with `env` added to its environment; its base
    URL once it answers."""
    port = free_port()
    proc = spawn("admin", "--bind", f"127.0.0.1:{port}", url=db_url, env=env)
    base = f"http://127.0.0.1:{port}"

    async def answers() -> bool:
        assert proc.poll() is None, proc.communicate()
        try:
            return (await http.get(f"{base}/admin/login")).status_code == 200
        except httpx.TransportError:
            return False

    async with httpx.AsyncClient() as http:
        await wait_for(answers, 60, "the admin app answers", interval_s=0.2)
    return base


async def seed(pool: asyncpg.Pool) -> tuple[UUID, UUID, UUID]:
    """Workspaces A (five failed jobs of two types, one completed) and B (one failed job)."""
    a = await make_workspace(pool, "Alfa")
    b = await make_workspace(pool, "Beta")
    sql = (
        "INSERT INTO job_queue (workspace_id, job_type, payload, status, attempts, error_msg,"
        " errors, completed_at) SELECT $1, $2, $3::text::jsonb, $4::job_status, 3, $5,"
        " jsonb_build_array(jsonb_build_object('attempt', 3, 'at', now(), 'class',"
        " 'transient', 'message', $5::text)), now() FROM generate_series(1, $6)"
    )
    await pool.execute(sql, a, "noop", '{"episode": 7}', "error", "HTTP 503 from whisper", 3)
    await pool.execute(sql, a, "srt_parse", '{"path": "/x.srt"}', "error", "bad SRT", 2)
    await pool.execute(sql, a, "noop", "{}", "completed", None, 1)
    await pool.execute(sql, b, "noop", '{"secret": "B-only"}', "error", "B failed", 1)
    b_job = await pool.fetchval("SELECT id FROM job_queue WHERE workspace_id = $1", b)
    return a, b, b_job


def token_for(db_url: str, *scope: str) -> str:
    out = cli("admin-token", "create", *scope, url=db_url)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def workspace_bearer(db_url: str, workspace: UUID) -> dict[str, str]:
    """Request headers with a new token for `workspace` alone."""
    return {"authorization": f"Bearer {token_for(db_url, '--workspace', str(workspace))}"}


async def new_jobs(pool: asyncpg.Pool, workspace: UUID, count: int) -> list[UUID]:
    """`count` pending noop jobs of `workspace`, inserted by plain SQL; their ids."""
    rows = await pool.fetch(
        "INSERT INTO job_queue (workspace_id, job_type, payload)"
        " SELECT $1, 'noop', '{}' FROM generate_series(1, $2) RETURNING id",
        workspace,
        count,
    )
    return [r["id"] for r in rows]
