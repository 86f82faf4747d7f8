"""The program as a user meets it: help, enqueue, types, and one clear line for bad input."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from uuid import UUID, uuid4

import asyncpg
import pytest

from sidelinja_worker.jobs.catalog import REGISTRY
from tests.helpers import cli, insert_jobs, one_line_error


def test_help_lists_subcommands_and_each_has_help() -> None:
    top = cli("--help", url=None)
    assert top.returncode == 0
    for command in (
        "migrate",
        "enqueue",
        "run",
        "types",
        "demo",
        "jobs",
        "workspace",
        "admin",
        "prune",
    ):
        assert command in top.stdout
        assert cli(command, "--help", url=None).returncode == 0


def test_types_lists_noop_with_priority() -> None:
    out = cli("types", url=None)
    assert out.returncode == 0
    assert any(line.split()[:2] == ["noop", "0"] for line in out.stdout.splitlines())


def test_types_fits_the_terminal_and_keeps_every_word() -> None:
    out = cli("types", url=None, env={"COLUMNS": "80"})
    assert out.returncode == 0, out.stderr
    assert max(len(line) for line in out.stdout.splitlines()) <= 80
    text = " ".join(out.stdout.split())
    for jt in REGISTRY.values():
        assert " ".join(jt.description.split()) in text
        assert " ".join(", ".join(jt.needs_settings).split()) in text


async def test_enqueue_prints_the_id_and_run_completes_it(
    db_url: str, pool: asyncpg.Pool, workspace: UUID
) -> None:
    out = cli(
        "enqueue",
        "noop",
        "--workspace",
        str(workspace),
        "--payload",
        '{"a": 1}',
        "--priority",
        "4",
        url=db_url,
    )
    assert out.returncode == 0, out.stderr
    job_id = UUID(out.stdout.strip())
    later = cli("enqueue", "noop", "--workspace", str(workspace), "--in", "10m", url=db_url)
    assert later.returncode == 0, later.stderr
    run = cli("run", "--burst", url=db_url)
    assert run.returncode == 0, run.stderr
    row = await pool.fetchrow(
        "SELECT status::text, priority, result FROM job_queue WHERE id = $1", job_id
    )
    assert tuple(row) == ("completed", 4, {"a": 1})
    waiting = await pool.fetchval(
        "SELECT status::text FROM job_queue WHERE id = $1", UUID(later.stdout.strip())
    )
    assert waiting == "pending"  # not due for ten minutes
    shown = cli("jobs", "show", str(job_id), url=db_url)
    assert json.loads(shown.stdout)["status"] == "completed"


async def test_log_level_quiets_the_line_per_job(
    db_url: str, pool: asyncpg.Pool, workspace: UUID
) -> None:
    await pool.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload) VALUES ($1, 'noop', '{}')",
        workspace,
    )
    chatty = cli("run", "--burst", url=db_url, env={"SIDELINJA_LOG_FORMAT": "text"})
    await pool.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload) VALUES ($1, 'noop', '{}')",
        workspace,
    )
    quiet = cli(
        "--log-level", "warning", "run", "--burst", url=db_url, env={"SIDELINJA_LOG_FORMAT": "text"}
    )
    assert chatty.returncode == quiet.returncode == 0, (chatty.stderr, quiet.stderr)
    assert "completed" in chatty.stderr and "completed" not in quiet.stderr
    assert await pool.fetchval("SELECT count(*) FROM job_queue WHERE status = 'completed'") == 2
    bad = cli("run", "--burst", url=db_url, env={"SIDELINJA_LOG_LEVEL": "loud"})
    assert "SIDELINJA_LOG_LEVEL must be one of" in one_line_error(bad)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--payload", "[1, 2]"], "--payload must be a JSON object"),
        (["--payload", "{nope"], "--payload is not JSON"),
        (["--in", "soon"], "bad duration 'soon'"),
    ],
)
async def test_bad_enqueue_input_is_one_line_and_writes_nothing(
    db_url: str, pool: asyncpg.Pool, workspace: UUID, args: list[str], expected: str
) -> None:
    out = cli("enqueue", "noop", "--workspace", str(workspace), *args, url=db_url)
    assert expected in one_line_error(out)
    assert await pool.fetchval("SELECT count(*) FROM job_queue") == 0


async def test_unknown_job_type_and_bad_workspace(db_url: str, pool: asyncpg.Pool) -> None:
    unknown = cli("enqueue", "transcribe_everything", "--workspace", str(uuid4()), url=db_url)
    message = one_line_error(unknown)
    assert "unknown job type 'transcribe_everything'; known: " in message and "noop" in message
    not_uuid = cli("enqueue", "noop", "--workspace", "ws-1", url=db_url)
    assert "--workspace 'ws-1' is not a UUID" in one_line_error(not_uuid)
    missing = cli("enqueue", "noop", "--workspace", str(uuid4()), url=db_url)
    assert "no workspace" in one_line_error(missing)
    for partial in (["noop"], ["--workspace", str(uuid4())], []):  # --file makes both optional
        out = cli("enqueue", *partial, url=db_url)
        assert "give JOB_TYPE and --workspace (or --file" in one_line_error(out)
    assert await pool.fetchval("SELECT count(*) FROM job_queue") == 0


def test_run_rejects_unknown_types_and_bad_durations(db_url: str) -> None:
    message = one_line_error(cli("run", "--types", "noop,bogus", "--burst", url=db_url))
    assert "unknown job types in --types: bogus; known: " in message and "noop" in message
    assert "bad duration '1 sekund'" in one_line_error(
        cli("run", "--poll-interval", "1 sekund", "--burst", url=db_url)
    )
    assert "bad duration 'x'" in one_line_error(
        cli("run", "--burst", url=db_url, env={"SIDELINJA_LEASE": "x"})
    )


def test_unreachable_database_is_one_line() -> None:
    out = cli("run", "--burst", url="postgresql://postgres@127.0.0.1:1/nowhere")
    assert (
        "cannot connect to the database at postgresql://postgres@127.0.0.1:1/nowhere"
        in one_line_error(out)
    )


def test_password_never_shown() -> None:
    out = cli("migrate", url="postgresql://postgres:hemmelig@127.0.0.1:1/x")
    assert "hemmelig" not in out.stderr and "***" in one_line_error(out)


def test_unmigrated_database_is_one_line(empty_db_url: str) -> None:
    out = cli("run", "--burst", url=empty_db_url)
    assert "the database is not migrated" in one_line_error(out)
    assert "sidelinja-worker migrate" in out.stderr


def test_debug_shows_the_traceback(empty_db_url: str) -> None:
    out = cli("--debug", "run", "--burst", url=empty_db_url)
    assert out.returncode != 0 and "Traceback" in out.stderr


def test_demo_runs_every_job_type_that_needs_no_service(db_url: str) -> None:
    out = cli("demo", url=db_url)
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line for line in out.stdout.splitlines() if line[:1].isalpha()}
    assert "completed" in rows["transcript"] and '"segments": 10' in rows["transcript"]
    assert "completed" in rows["downloads"] and '"new_downloads": 4' in rows["downloads"]
    assert "error" in rows["flaky"] and "the service answered 503" in rows["flaky"]
    assert "AI_GATEWAY_URL" in out.stdout  # the unconfigured types say what to set
    shown = cli("jobs", "show", rows["hello"].split()[1], url=db_url)  # the summary's job id
    assert shown.returncode == 0 and json.loads(shown.stdout)["status"] == "completed"


async def test_service_settings_are_flags_and_secrets_come_from_env_or_file(
    db_url: str, pool: asyncpg.Pool, workspace: UUID, tmp_path: Path
) -> None:
    job_id = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload, max_attempts)"
        " VALUES ($1, 'research_clip', '{\"text\": \"hei\"}', 1) RETURNING id",
        workspace,
    )
    env = {"AI_GATEWAY_URL": "", "AI_GATEWAY_KEY": ""}
    assert cli("run", "--burst", url=db_url, env=env).returncode == 0
    message = await pool.fetchval("SELECT error_msg FROM job_queue WHERE id = $1", job_id)
    assert "AI_GATEWAY_URL" in message and "not set" in message
    await pool.execute(
        "UPDATE job_queue SET status = 'pending', attempts = 0 WHERE id = $1", job_id
    )
    # A secret is no flag (it would show in `ps`): its variable, or a file named by NAME_FILE.
    assert "--ai-gateway-key" not in cli("run", "--help", url=None).stdout
    key_file = tmp_path / "key"
    key_file.write_text("sk-hemmelig\n")
    env["AI_GATEWAY_KEY_FILE"] = str(key_file)
    flags = ("--ai-gateway-url", "http://127.0.0.1:1/api/v1")
    assert cli("run", "--burst", *flags, url=db_url, env=env).returncode == 0
    message = await pool.fetchval("SELECT error_msg FROM job_queue WHERE id = $1", job_id)
    assert "not set" not in message and "hemmelig" not in message  # it tried the gateway
    both = cli("run", "--burst", url=db_url, env={**env, "AI_GATEWAY_KEY": "sk-x"})
    assert "AI_GATEWAY_KEY and AI_GATEWAY_KEY_FILE are both set" in one_line_error(both)


def test_run_no_longer_takes_the_spacetimedb_flag_it_never_read() -> None:
    out = cli("run", "--spacetimedb-url", "http://127.0.0.1:1", "--burst", url=None)
    assert out.returncode == 2 and "unrecognized arguments: --spacetimedb-url" in out.stderr
    assert "--spacetimedb-url" in cli("admin", "--help", url=None).stdout


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--in", "10"], "--in: bad duration '10': a unit is needed, e.g. 10s or 10m"),
        (["--in", "-5m"], "--in: bad duration '-5m': must not be negative"),
        (["--timeout", "0s"], "--timeout must be at least 1s, not '0s'"),
        (["--timeout", "10"], "--timeout: bad duration '10': a unit is needed, e.g. 10s or 10m"),
        (["--max-attempts", "0"], "--max-attempts must be 1 to 32767, not 0"),
        (["--priority", "99999"], "--priority must be -32767 to 32767"),
    ],
)
async def test_enqueue_names_the_flag_and_the_rule(
    db_url: str, pool: asyncpg.Pool, workspace: UUID, args: list[str], expected: str
) -> None:
    out = cli("enqueue", "noop", "--workspace", str(workspace), *args, url=db_url)
    assert one_line_error(out) == f"sidelinja-worker: error: {expected}"
    assert await pool.fetchval("SELECT count(*) FROM job_queue") == 0


async def test_enqueue_warns_of_a_past_time_and_a_service_not_set_here(
    db_url: str, pool: asyncpg.Pool, workspace: UUID
) -> None:
    no_gateway = {"AI_GATEWAY_URL": "", "AI_GATEWAY_KEY": ""}
    past = cli(
        "enqueue",
        "research_clip",
        "--workspace",
        str(workspace),
        "--payload",
        '{"text": "hei"}',
        "--at",
        "2020-01-01T12:00",
        url=db_url,
        env=no_gateway,
    )
    assert past.returncode == 0, past.stderr
    job_id = UUID(past.stdout.strip())
    assert "warning: --at 2020-01-01T12:00 is in the past; the job is due now" in past.stderr
    assert "warning: research_clip needs AI_GATEWAY_URL, AI_GATEWAY_KEY, not set here" in (
        past.stderr
    )
    why = cli("jobs", "why", str(job_id), url=db_url, env=no_gateway)
    assert why.returncode == 0, why.stderr
    assert "research_clip needs AI_GATEWAY_URL, AI_GATEWAY_KEY, not set here" in why.stdout
    configured = {"AI_GATEWAY_URL": "http://127.0.0.1:1", "AI_GATEWAY_KEY": "sk-x"}
    quiet = cli(
        "enqueue", "noop", "--workspace", str(workspace), "--in", "1h", url=db_url, env=configured
    )
    assert quiet.returncode == 0 and "warning" not in quiet.stderr, quiet.stderr
    why = cli("jobs", "why", str(job_id), url=db_url, env=configured)
    assert "not set here" not in why.stdout


async def test_workspace_list_shows_every_workspace(db_url: str) -> None:
    empty = cli("workspace", "list", url=db_url)
    assert empty.returncode == 0 and empty.stdout == "", empty
    ws = uuid4()
    assert cli("workspace", "create", "Podkast", "--id", str(ws), url=db_url).returncode == 0
    listed = cli("workspace", "list", url=db_url)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines() == [f"{ws}  Podkast"]


def test_booleans_and_durations_follow_one_rule_everywhere(db_url: str) -> None:
    for word in ("on", "1", "TRUE", "yes"):
        out = cli("run", url=db_url, env={"SIDELINJA_BURST": word, "SIDELINJA_NO_LISTEN": word})
        assert out.returncode == 0, (word, out.stderr)  # burst: it ends
    bad = cli("run", url=db_url, env={"SIDELINJA_BURST": "maybe"})
    assert "--burst / SIDELINJA_BURST: 'maybe' is not on/off, true/false, yes/no or 1/0" in (
        one_line_error(bad)
    )
    assert "a unit is needed" in one_line_error(
        cli("run", "--burst", url=db_url, env={"SIDELINJA_GRACE": "30"})
    )
    assert "--lease / SIDELINJA_LEASE must be 1s to 1d" in one_line_error(
        cli("run", "--burst", "--lease=500ms", url=db_url)
    )


async def test_limits_fair_takes_the_same_booleans(db_url: str, pool: asyncpg.Pool) -> None:
    fair = "SELECT value FROM queue_settings WHERE name = 'fair_workspaces'"
    assert cli("limits", "fair", "no", url=db_url).returncode == 0
    assert await pool.fetchval(fair) is False
    assert cli("limits", "fair", "ON", url=db_url).returncode == 0
    assert await pool.fetchval(fair) is True
    assert "limits fair takes on or off" in one_line_error(
        cli("limits", "fair", "maybe", url=db_url)
    )


def test_top_redraws_within_its_bounds_whatever_the_interval() -> None:
    """argparse's float takes "nan" and "inf": a NaN made every redraw sleep NaN seconds."""
    from sidelinja_worker.cli.top import REDRAW_MAX_S, REDRAW_MIN_S, redraw_interval_s

    assert redraw_interval_s(2.5) == 2.5
    assert redraw_interval_s(0.0) == redraw_interval_s(-5.0) == REDRAW_MIN_S
    assert redraw_interval_s(float("inf")) == redraw_interval_s(1e308) == REDRAW_MAX_S
    assert redraw_interval_s(float("nan")) == 2.0


async def test_top_prints_any_job_type_as_text(
    db_url: str, pool: asyncpg.Pool, workspace: UUID
) -> None:
    """A job type is any text the web app writes: one that reads as rich markup ("[/]") made
    `top` fail with a MarkupError, and terminal escapes went to the terminal as they were."""
    for job_type in ("[/]", "[bold]x", "\x1b]0;owned\x07\x1b[2Jt"):
        await insert_jobs(pool, workspace, 1, job_type_name=job_type)
    out = cli("top", "--once", url=db_url, env={"COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    assert "[/]" in out.stdout and "[bold]x" in out.stdout
    assert "\x1b" not in out.stdout and "\x07" not in out.stdout
    assert "\\x1b]0;owned\\x07\\x1b[2Jt" in out.stdout


async def test_jobs_list_show_and_why_print_no_terminal_controls(
    db_url: str, pool: asyncpg.Pool, workspace: UUID
) -> None:
    """A job type or error message may hold any text (the web app's SQL, or a payload quoted in
    an error): escape sequences, C1 controls and bidi overrides are printed as escapes, and
    the JSON of `jobs show` and `jobs list --json` still reads back to the stored values."""
    job_type, error = "\x1b[2Jt\x9b", "\x1b]0;owned\x07 boom \u202egnp.exe"
    job_id = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload, status, error_msg)"
        " VALUES ($1, $2, jsonb_build_object('path', $3::text), 'error', $3) RETURNING id",
        workspace,
        job_type,
        error,
    )
    commands = {
        "list": ("jobs", "list"),
        "list --json": ("jobs", "list", "--json"),
        "show": ("jobs", "show", str(job_id)),
        "why": ("jobs", "why", str(job_id)),
    }
    outs = await asyncio.gather(
        *(asyncio.to_thread(cli, *args, url=db_url) for args in commands.values())
    )
    runs = dict(zip(commands, outs, strict=True))
    for name, out in runs.items():
        assert out.returncode == 0, (name, out.stderr)
        unsafe = [c for c in out.stdout if c in "\x1b\x07\x9b\u202e"]
        assert not unsafe, (name, out.stdout)
    assert "\\x1b]0;owned\\x07 boom \\u202egnp.exe" in runs["list"].stdout
    assert "\\x1b]0;owned\\x07 boom \\u202egnp.exe" in runs["why"].stdout
    shown = json.loads(runs["show"].stdout)
    assert (shown["job_type"], shown["error_msg"], shown["payload"]["path"]) == (
        job_type,
        error,
        error,
    )
    (listed,) = json.loads(runs["list --json"].stdout)
    assert (listed["job_type"], listed["error_msg"]) == (job_type, error)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ((), "sidelinja-worker: error: the following arguments are required: COMMAND"),
        (
            ("enqueue", "noop", "--priority", "abc"),
            "sidelinja-worker enqueue: error: argument --priority: invalid int value: 'abc'",
        ),
        (
            ("enqueue", "noop", "--in", "1m", "--at", "2030-01-01"),
            "sidelinja-worker enqueue: error: argument --at: not allowed with argument --in",
        ),
        (("jobs", "show"), "sidelinja-worker jobs show: error: the following arguments are"),
    ],
)
def test_a_malformed_command_line_is_one_line_that_points_to_the_help(
    args: tuple[str, ...], says: str
) -> None:
    out = cli(*args, url=None)
    assert out.returncode == 2
    line = one_line_error(out)
    assert line.startswith(says), line
    command = says.split(": error")[0]
    assert line.endswith(f"; see `{command} --help`"), line


@pytest.mark.parametrize(
    "args",
    [
        ("jobs", "list", "--debug"),
        ("workspace", "list", "--log-level", "warning"),
        ("admin-token", "list", "--log-format", "text"),
        ("jobs", "list", "--status", "all", "--debug"),
    ],
)
def test_the_global_flags_come_after_an_action_too(db_url: str, args: tuple[str, ...]) -> None:
    out = cli(*args, url=db_url)
    assert out.returncode == 0, out.stderr
