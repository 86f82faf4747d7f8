"""Long CLI work with progress: `enqueue --file`, `prune` and `migrate`. Correctness through
pipes (where no control character may appear), and the live bar in a real pseudo-terminal
(tmux), as tests/test_top.py drives `top`."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from uuid import UUID, uuid4

import asyncpg
import pytest

from sidelinja_worker.queue import migrate
from tests.helpers import cli, make_workspace, one_line_error, spawn, wait_for
from tests.test_rls import RoleMaker, as_user, make_role_fixture  # noqa: F401 (fixture)
from tests.test_top import _screen_shows, _tmux

CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # anything but tab and newline
needs_tmux = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


def _plain(proc: subprocess.CompletedProcess[str]) -> None:
    """Piped output is plain lines: no escape sequences, no carriage returns."""
    for name, text in (("stdout", proc.stdout), ("stderr", proc.stderr)):
        found = CONTROL.search(text)
        assert found is None, f"control character {found[0]!r} in piped {name}:\n{text}"


def _jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


# --- enqueue --file ------------------------------------------------------------------------


async def test_ten_thousand_lines_are_enqueued_exactly_once(
    db_url: str, pool: asyncpg.Pool, workspace: UUID, tmp_path: Path
) -> None:
    other = await make_workspace(pool, "other")
    rows: list[dict[str, object]] = [
        {"job_type": "noop", "payload": {"n": i}} for i in range(10_000)
    ]
    rows[7] = {"job_type": "noop", "payload": {"n": 7}, "workspace_id": str(other), "priority": 9}
    rows[8] = {"payload": {"n": 8}, "scheduled_for": "2030-01-01T00:00:00"}  # JOB_TYPE default
    rows[9] = {"job_type": "noop", "payload": {"n": 9}, "unique_key": "k9", "max_attempts": 5}
    path = _jsonl(tmp_path / "jobs.jsonl", rows)
    out = cli("enqueue", "noop", "--file", str(path), "--workspace", str(workspace), url=db_url)
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"enqueued 10000 jobs from {path}\n"
    _plain(out)
    counts = await pool.fetchrow(
        "SELECT count(*) AS jobs, count(DISTINCT (payload->>'n')::int) AS distinct_n,"
        " min((payload->>'n')::int) AS lo, max((payload->>'n')::int) AS hi FROM job_queue"
    )
    assert tuple(counts) == (10_000, 10_000, 0, 9_999)
    seven = await pool.fetchrow(
        "SELECT workspace_id, priority FROM job_queue WHERE payload->>'n' = '7'"
    )
    assert tuple(seven) == (other, 9)
    eight = await pool.fetchval("SELECT scheduled_for FROM job_queue WHERE payload->>'n' = '8'")
    assert eight.isoformat() == "2030-01-01T00:00:00+00:00"  # UTC when no zone is given
    nine = await pool.fetchrow(
        "SELECT unique_key, max_attempts FROM job_queue WHERE payload->>'n' = '9'"
    )
    assert tuple(nine) == ("k9", 5)
    # Each line's workspace is its own or --workspace.
    assert (
        await pool.fetchval("SELECT count(*) FROM job_queue WHERE workspace_id = $1", workspace)
        == 9_999
    )


@pytest.mark.parametrize(
    "bad, says",
    [
        (
            '{"job_type": "noop", "priority": "high"}',
            "line 321: priority: Input should be a valid integer",
        ),
        (
            '{"job_type": "noop", "payload": [1]}',
            "line 321: payload: Input should be an object",
        ),
        ('{"job_type": "noop", "paylod": {}}', "line 321: paylod: Extra inputs are not permitted"),
        ('{"job_type": "no_such_type"}', "line 321: unknown job type 'no_such_type'"),
        ('{"job_type": "noop", "workspace_id": "x"}', "line 321: workspace_id 'x' is not a UUID"),
        ('{"job_type": "noop", "max_attempts": 0}', "line 321: max_attempts must be 1.."),
        ('{"job_type": "noop", "scheduled_for": "soon"}', "line 321: scheduled_for 'soon' is not"),
        ('{"job_type": "noop"', "line 321: Invalid JSON"),
        ("[]", "line 321: Input should be an object"),
        (
            '{"job_type": "noop", "payload": {"x": "' + "y" * (1 << 20) + '"}}',
            "line 321: longer than 1048576 bytes",
        ),
    ],
)
async def test_a_bad_line_enqueues_nothing_and_names_its_line(
    db_url: str, pool: asyncpg.Pool, workspace: UUID, tmp_path: Path, bad: str, says: str
) -> None:
    good = json.dumps({"job_type": "noop"})
    path = tmp_path / "jobs.jsonl"
    path.write_text("\n".join([good] * 320 + [bad] + [good] * 700) + "\n", encoding="utf-8")
    out = cli("enqueue", "--file", str(path), "--workspace", str(workspace), url=db_url)
    error = one_line_error(out)
    assert says in error and error.endswith("nothing was enqueued"), error
    assert out.returncode == 2
    _plain(out)
    assert await pool.fetchval("SELECT count(*) FROM job_queue") == 0


async def test_skip_bad_enqueues_the_good_lines_from_stdin(
    db_url: str, pool: asyncpg.Pool, workspace: UUID
) -> None:
    lines = [json.dumps({"job_type": "noop", "payload": {"n": i}}) for i in range(200)]
    lines[5] = '{"job_type": "noop", "payload": 5}'
    lines[150] = "not json"
    lines[151] = ""  # blank: skipped, not bad
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"} | {"DATABASE_URL": db_url}
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "sidelinja_worker", "enqueue", "--file", "-", "--skip-bad"),
        *("--workspace", str(workspace)),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    stdout, stderr = await asyncio.wait_for(
        proc.communicate(("\n".join(lines) + "\n").encode()), timeout=120
    )
    out = subprocess.CompletedProcess(
        proc.args if hasattr(proc, "args") else [],
        proc.returncode or 0,
        stdout.decode(),
        stderr.decode(),
    )
    assert out.returncode == 1, out.stderr  # done, but not everything: a script must notice
    assert out.stdout == "enqueued 197 jobs from stdin; skipped 2 bad lines (listed above)\n"
    assert "skipped stdin line 6: payload" in out.stderr
    assert "skipped stdin line 151: Invalid JSON" in out.stderr
    _plain(out)
    assert await pool.fetchval("SELECT count(*) FROM job_queue") == 197


async def test_a_line_whose_unique_key_is_held_joins_the_holder(
    db_url: str, pool: asyncpg.Pool, workspace: UUID, tmp_path: Path
) -> None:
    held = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload, unique_key)"
        " VALUES ($1, 'noop', '{}', 'nightly') RETURNING id",
        workspace,
    )
    rows = [{"job_type": "noop", "unique_key": k} for k in ("nightly", "new", "new", "other")]
    path = _jsonl(tmp_path / "jobs.jsonl", rows)
    out = cli("enqueue", "--file", str(path), "--workspace", str(workspace), url=db_url)
    assert out.returncode == 0, out.stderr
    assert out.stdout == (
        f"enqueued 2 jobs from {path}; 2 lines joined the job holding its unique key\n"
    )
    keys = await pool.fetch("SELECT unique_key, id FROM job_queue ORDER BY unique_key")
    assert [k[0] for k in keys] == ["new", "nightly", "other"] and keys[1][1] == held


async def test_file_flags_that_belong_on_the_line_are_refused(
    db_url: str, workspace: UUID, tmp_path: Path
) -> None:
    path = _jsonl(tmp_path / "jobs.jsonl", [{"job_type": "noop"}])
    out = cli(
        "enqueue", "--file", str(path), "--priority", "3", "--workspace", str(workspace), url=db_url
    )
    assert "--priority does not go with --file" in one_line_error(out)
    missing = cli("enqueue", "--file", str(tmp_path / "nope.jsonl"), url=db_url)
    assert "--file: cannot read" in one_line_error(missing)
    no_workspace = cli("enqueue", "--file", str(path), url=db_url)
    assert "line 1: no workspace_id" in one_line_error(no_workspace)
    ghost = cli("enqueue", "--file", str(path), "--workspace", str(uuid4()), url=db_url)
    assert "line 1: no workspace " in one_line_error(ghost)


async def test_under_row_level_security_the_file_goes_in_by_insert(
    db_url: str, pool: asyncpg.Pool, workspace: UUID, tmp_path: Path, make_role: RoleMaker
) -> None:
    """COPY is refused where row-level security applies: a role that has it (the web app's,
    given what the CLI reads besides) enqueues a file all the same, checked row by row by the
    policies; a line for another workspace is refused by them, and nothing goes in."""
    role = await make_role(
        "GRANT sidelinja_app TO {r}", "GRANT SELECT ON sidelinja_schema_migrations TO {r}"
    )
    base = as_user(db_url, role)  # the embedded server's URL already has a query (?host=)
    url = f"{base}{'&' if '?' in base else '?'}sidelinja.workspace_id={workspace}"
    path = _jsonl(
        tmp_path / "jobs.jsonl", [{"job_type": "noop", "payload": {"n": i}} for i in range(300)]
    )
    out = cli("enqueue", "--file", str(path), "--workspace", str(workspace), url=url)
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"enqueued 300 jobs from {path}\n"
    assert await pool.fetchval("SELECT count(DISTINCT payload->>'n') FROM job_queue") == 300
    other = await make_workspace(pool, "other")
    rows = [{"job_type": "noop"}] * 100 + [{"job_type": "noop", "workspace_id": str(other)}]
    crossing = cli(
        "enqueue",
        "--file",
        str(_jsonl(tmp_path / "x.jsonl", rows)),
        "--workspace",
        str(workspace),
        url=url,
    )
    assert "line 101: no workspace" in one_line_error(crossing)  # the policy hides it
    assert await pool.fetchval("SELECT count(*) FROM job_queue") == 300


# --- prune ---------------------------------------------------------------------------------


async def _finished(
    pool: asyncpg.Pool, workspace: UUID, status: str, days_ago: float, name: str
) -> UUID:
    job_id: UUID = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload, status, completed_at)"
        " VALUES ($1, 'noop', jsonb_build_object('name', $2::text), $3::job_status,"
        "         now() - make_interval(secs => $4))"
        " RETURNING id",
        workspace,
        name,
        status,
        days_ago * 86400,
    )
    return job_id


async def _retention_fixture(pool: asyncpg.Pool, workspace: UUID) -> tuple[set[str], set[str]]:
    """Jobs on both sides of the default retention (14 days completed, 90 days errors), two job
    graphs; returns (the names that must go, the names that must stay)."""
    for i in range(3):
        await _finished(pool, workspace, "completed", 20, f"old-{i}")
    await pool.execute(  # more than one prune batch
        "INSERT INTO job_queue (workspace_id, job_type, payload, status, completed_at)"
        " SELECT $1, 'noop', jsonb_build_object('name', 'bulk-' || g), 'completed',"
        "        now() - interval '30 days' FROM generate_series(1, 2497) g",
        workspace,
    )
    await _finished(pool, workspace, "cancelled", 15, "cancelled-old")
    await _finished(pool, workspace, "error", 100, "error-old")
    await _finished(pool, workspace, "completed", 13, "completed-young")
    await _finished(pool, workspace, "error", 20, "error-young")
    await pool.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload) VALUES ($1, 'noop', '{\"name\": \"pending\"}')",
        workspace,
    )
    # A graph all past retention goes whole; one with a young child stays whole.
    for graph, child_days in (("gone", 40), ("kept", 1)):
        parent = await _finished(pool, workspace, "completed", 40, f"{graph}-parent")
        child = await _finished(pool, workspace, "completed", child_days, f"{graph}-child")
        grandchild = await _finished(pool, workspace, "completed", 40, f"{graph}-grandchild")
        await pool.execute(
            "INSERT INTO job_dependencies (parent_id, child_id) VALUES ($1, $2), ($2, $3)",
            parent,
            child,
            grandchild,
        )
    gone = {f"old-{i}" for i in range(3)} | {f"bulk-{g}" for g in range(1, 2498)}
    gone |= {"cancelled-old", "error-old", "gone-parent", "gone-child", "gone-grandchild"}
    kept = {"completed-young", "error-young", "pending", "kept-parent", "kept-child"}
    return gone, kept | {"kept-grandchild"}


async def _names(pool: asyncpg.Pool) -> set[str]:
    return {r[0] for r in await pool.fetch("SELECT payload->>'name' FROM job_queue")}


async def test_prune_deletes_exactly_the_jobs_past_retention_and_keeps_graphs_whole(
    db_url: str, pool: asyncpg.Pool, workspace: UUID
) -> None:
    gone, kept = await _retention_fixture(pool, workspace)
    assert await _names(pool) == gone | kept
    dry = cli("prune", "--dry-run", url=db_url)
    assert dry.returncode == 0, dry.stderr
    # kept-parent and kept-grandchild are past retention but held by their young middle job.
    assert dry.stdout == (
        f"would prune {len(gone)} jobs; 2 past retention kept (with a graph not yet past it,"
        " or referenced from another table)\n"
    )
    _plain(dry)
    assert await _names(pool) == gone | kept  # a dry run deletes nothing
    out = cli("prune", url=db_url)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"pruned {len(gone)} jobs;")
    _plain(out)
    assert await _names(pool) == kept
    assert await pool.fetchval("SELECT count(*) FROM job_dependencies") == 2  # kept graph's edges
    again = cli("prune", url=db_url)
    assert again.stdout.startswith("pruned 0 jobs")
    # The command's own retention, bounded as the worker's flags are.
    shorter = cli("prune", "--keep-errors", "10d", url=db_url)
    assert shorter.stdout.startswith("pruned 1 job;"), shorter.stdout  # error-young
    assert "--keep-errors" in one_line_error(cli("prune", "--keep-errors", "5", url=db_url))


# --- in a terminal -------------------------------------------------------------------------


@contextmanager
def terminal(db_url: str, *args: str, log_format: str = "") -> Iterator[str]:
    """`sidelinja-worker ARGS` in a tmux pseudo-terminal whose pane stays after the command
    ends (it prints EXIT=code); yields the tmux socket, whose session is "top" as in
    tests/test_top.py, whose screen reader this reuses."""
    socket = f"sidelinja-cli-{os.getpid()}-{uuid4().hex[:6]}"
    command = (
        f"DATABASE_URL={shlex.quote(db_url)} SIDELINJA_LOG_FORMAT={log_format}"
        f" {shlex.quote(sys.executable)}"
        f" -m sidelinja_worker {shlex.join(args)}; echo EXIT=$?; sleep 600"
    )
    _tmux(socket, "new-session", "-d", "-s", "top", "-x", "160", "-y", "40", command)
    try:
        yield socket
    finally:
        _tmux(socket, "kill-server")


async def _final_screen(db_url: str, *args: str, log_format: str = "") -> str:
    with terminal(db_url, *args, log_format=log_format) as socket:
        return await _screen_shows(socket, "EXIT=0", timeout_s=60)


@needs_tmux
async def test_enqueue_file_and_prune_show_a_bar_in_a_terminal(
    db_url: str, pool: asyncpg.Pool, workspace: UUID, tmp_path: Path
) -> None:
    path = _jsonl(tmp_path / "jobs.jsonl", [{"job_type": "noop"} for _ in range(10_000)])
    screen = await _final_screen(
        db_url, "enqueue", "--file", str(path), "--workspace", str(workspace)
    )
    assert re.search(r"enqueueing jobs\.jsonl .*━.* 100% .*10000 jobs", screen), screen
    assert "enqueued 10000 jobs" in screen
    # JSON logs on a terminal: a log collector reads them, so no bar, only the final line.
    args = ("enqueue", "--file", str(path), "--workspace", str(workspace))
    screen = await _final_screen(db_url, *args, log_format="json")
    assert "enqueued 10000 jobs" in screen and "━" not in screen and "%" not in screen, screen
    await pool.execute(
        "UPDATE job_queue SET status = 'completed', completed_at = now() - interval '15 days'"
    )
    screen = await _final_screen(db_url, "prune")
    assert re.search(r"deleting finished jobs .*━.* 100% .*20000/20000", screen), screen
    assert "pruned 20000 jobs" in screen  # both runs


@needs_tmux
async def test_migrate_shows_which_migration_runs_and_for_how_long(
    db_url: str, pool: asyncpg.Pool
) -> None:
    """A migration held up on a big table looks the same as one blocked by a lock: the test
    holds job_queue so that re-running 0013 (an index build) waits, and watches the screen."""
    await pool.execute("DROP INDEX idx_job_queue_admin_pending_by_id")
    await pool.execute("DELETE FROM sidelinja_schema_migrations WHERE version = 13")
    async with pool.acquire() as holder:
        transaction = holder.transaction()
        await transaction.start()
        await holder.execute("LOCK TABLE job_queue IN ROW EXCLUSIVE MODE")
        with terminal(db_url, "migrate") as socket:
            await _screen_shows(
                socket, "migration 1 of 1: 0013_admin_pending_index_by_id", "0:00:02"
            )
            await transaction.rollback()
            screen = await _screen_shows(socket, "EXIT=0")
            assert "applied: 0013_admin_pending_index_by_id" in screen
    assert await pool.fetchval(
        "SELECT to_regclass('idx_job_queue_admin_pending_by_id') IS NOT NULL"
    )
    piped = cli("migrate", url=db_url)
    assert piped.stdout == "up to date\n"
    _plain(piped)


async def test_migrate_says_when_it_waits_for_another_migrate(
    db_url: str, pool: asyncpg.Pool
) -> None:
    async with pool.acquire() as holder:
        await holder.execute("SELECT pg_advisory_lock($1)", migrate.LOCK_KEY)
        try:
            proc = spawn("migrate", url=db_url)
            await wait_for(
                lambda: "waiting for another migrate" in proc.stderr_so_far(), 60, "the notice"
            )
            assert proc.poll() is None  # it waits for the lock, it does not give up
        finally:
            await holder.execute("SELECT pg_advisory_unlock($1)", migrate.LOCK_KEY)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and out == "up to date\n", err
