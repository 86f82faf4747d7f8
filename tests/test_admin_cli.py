"""`admin-token`, `jobs list` and `jobs retry` as real processes; the worker's metrics endpoint;
JSON log lines tagged with the job."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from uuid import UUID

import asyncpg

from sidelinja_worker.queue import logs, metrics
from sidelinja_worker.queue.jobs import ClaimedJob
from tests.helpers import cli, insert_jobs, metrics_text, one_line_error


async def test_tokens_are_created_hashed_listed_and_revoked(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    made = cli("admin-token", "create", "--workspace", str(workspace), "--label", "ops", url=db_url)
    token = made.stdout.strip()
    assert made.returncode == 0 and token.startswith("slj_")
    stored = await pool.fetchval("SELECT token_sha256 FROM admin_tokens")
    assert token.encode() not in bytes(stored)
    listed = cli("admin-token", "list", url=db_url)
    assert str(workspace) in listed.stdout and token not in listed.stdout
    token_id = listed.stdout.split()[0]
    assert cli("admin-token", "revoke", token_id, url=db_url).returncode == 0
    assert "no active token" in one_line_error(cli("admin-token", "revoke", token_id, url=db_url))
    assert "revoked" in cli("admin-token", "list", url=db_url).stdout
    assert cli("admin-token", "create", "--all", url=db_url).returncode == 0
    assert "no workspace" in one_line_error(
        cli("admin-token", "create", "--workspace", str(UUID(int=1)), url=db_url)
    )


async def test_jobs_list_and_retry(pool: asyncpg.Pool, db_url: str, workspace: UUID) -> None:
    await insert_jobs(pool, workspace, 2)
    failed = await pool.fetchval(
        "UPDATE job_queue SET status = 'error', attempts = 3,"
        " error_msg = 'boom' WHERE id = (SELECT min(id::text)::uuid"
        " FROM job_queue) RETURNING id"
    )
    table = cli("jobs", "list", url=db_url)
    assert table.returncode == 0 and str(failed) in table.stdout and "boom" in table.stdout
    rows = json.loads(cli("jobs", "list", "--status", "all", "--json", url=db_url).stdout)
    assert len(rows) == 2 and {r["status"] for r in rows} == {"error", "pending"}
    only = json.loads(
        cli(
            "jobs",
            "list",
            "--status",
            "pending",
            "--type",
            "noop",
            "--workspace",
            str(workspace),
            "--json",
            url=db_url,
        ).stdout
    )
    assert [r["status"] for r in only] == ["pending"]
    assert cli("jobs", "retry", str(failed), url=db_url).returncode == 0
    row = await pool.fetchrow(
        "SELECT status::text, max_attempts FROM job_queue WHERE id = $1", failed
    )
    assert tuple(row) == ("pending", 4)
    assert "only error or retry" in one_line_error(cli("jobs", "retry", str(failed), url=db_url))
    assert "bad" in one_line_error(cli("jobs", "list", "--status", "bad", url=db_url))


async def test_worker_metrics_endpoint(pool: asyncpg.Pool, workspace: UUID) -> None:
    await insert_jobs(pool, workspace, 3)
    # A job type no other test uses: the hooks' counters are process-wide.
    metrics.completed("metrics_probe", 0.02)
    metrics.failed("metrics_probe")
    metrics.picked_up("metrics_probe", 0.2)
    server = await metrics.serve(pool, 0, "127.0.0.1")
    port = server.sockets[0].getsockname()[1]
    try:
        body = await metrics_text(port)
    finally:
        server.close()
    assert body is not None and body.startswith("HTTP/1.1 200")
    assert 'sidelinja_jobs{job_type="noop",status="pending"} 3.0' in body
    assert 'sidelinja_jobs_processed_total{job_type="metrics_probe",outcome="failed"}' in body
    assert "sidelinja_job_run_seconds_bucket" in body
    assert (
        'sidelinja_job_pickup_latency_seconds_bucket{job_type="metrics_probe",le="0.5"} 1.0' in body
    )
    assert "sidelinja_oldest_due_job_age_seconds" in body


async def test_json_log_lines_carry_the_job() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.JsonFormatter())
    log = logging.getLogger("sidelinja_worker.test_logs")
    log.addHandler(handler)
    job = ClaimedJob(UUID(int=7), UUID(int=8), "noop", {}, 0, 2, 3, None)

    async def in_job_task() -> None:
        logs.bind_job(job)
        log.warning("job failed")

    try:
        await asyncio.create_task(in_job_task())
        log.warning("not about a job")  # the job's tag stayed in its own task
    finally:
        log.removeHandler(handler)
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert (first["job_id"], first["job_type"], first["workspace_id"], first["attempt"]) == (
        str(UUID(int=7)),
        "noop",
        str(UUID(int=8)),
        2,
    )
    assert first["msg"] == "job failed" and "job_id" not in second
