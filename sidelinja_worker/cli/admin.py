"""The `admin`, `admin-token` and `jobs list|retry` commands. cli.py calls `add_commands` and
`add_jobs_commands`; commands.dispatch calls `dispatch` first."""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
from typing import Any
from uuid import UUID

import asyncpg

from sidelinja_worker import settings
from sidelinja_worker.admin import auth, store
from sidelinja_worker.admin.spacetime import SpacetimeTarget
from sidelinja_worker.admin.store import JobFilter, Scope
from sidelinja_worker.cli import jobids
from sidelinja_worker.cli.session import json_default, opened, why_not_listening
from sidelinja_worker.queue.config import Secret
from sidelinja_worker.queue.errors import UserError
from sidelinja_worker.queue.escapes import printable, printable_json
from sidelinja_worker.settings import Settings

ALL = Scope(token_id=None, workspace_id=None)
MAX_LIST = 100_000  # jobs one `jobs list` prints
TYPE_SHOWN = 40  # characters of a job type in the table (the catalog's longest has 25)
ERROR_SHOWN = 60  # characters of the last error in the table (`jobs show` has all of it)
# At a terminal: the characters of a row but its job type and error (a short id, the status,
# the tries, the time to the minute and the gaps), the fewest of an error worth a column, and
# the indent of an error on a line of its own.
FITTED_FIXED = 15 + 2 + 1 + 9 + 1 + 5 + 2 + 11 + 2
ERROR_MIN = 20
ERROR_INDENT = "    "
COLUMNS = (
    "id",
    "workspace_id",
    "job_type",
    "status",
    "attempts",
    "max_attempts",
    "created_at",
    "error_msg",
)


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("admin", help="serve the admin web view (/admin/jobs, /metrics)")
    settings.add_flags(p, "admin")
    p = sub.add_parser("admin-token", help="tokens for the admin view")
    tsub = p.add_subparsers(dest="token_command", required=True, metavar="ACTION")
    t = tsub.add_parser("create", help="create a token and print it (shown once)")
    which = t.add_mutually_exclusive_group(required=True)
    which.add_argument("--workspace", help="the workspace it may see")
    which.add_argument("--all", action="store_true", help="every workspace (platform admins)")
    t.add_argument("--label", help="a note on whose token it is")
    t = tsub.add_parser("revoke", help="revoke a token by its id (see `list`)")
    t.add_argument("token_id", metavar="ID")
    tsub.add_parser("list", help="list tokens (ids, scopes; never the tokens)")


def add_jobs_commands(jsub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from sidelinja_worker.admin.forms import STATUSES

    # Both lists come from the code that orders and checks them, so the help cannot drift.
    after = ", ".join(store.STATUS_ORDER[1:])
    j = jsub.add_parser(
        "list",
        help=f"jobs, newest first (default: errors); with --status all, errors first, then {after}",
        description="At a terminal the table fits its width: ids are short (the first 8 and "
        "last 6 hex digits, which `jobs show`, `why`, `cancel` and `retry` take as they take "
        "any unambiguous start of an id), times are to the minute (UTC), and the last error "
        "takes the room left or a line of its own. Piped, the ids are whole; --json has every "
        "column whole.",
    )
    j.add_argument(
        "--status", default="error", help=f"{', '.join(STATUSES)} or all (default error)"
    )
    j.add_argument("--type", help="only this job type")
    j.add_argument("--workspace", help="only this workspace")
    j.add_argument(
        "--limit", type=int, default=50, help=f"at most this many (50; up to {MAX_LIST:,})"
    )
    j.add_argument("--json", action="store_true", help="one JSON array, for scripts")
    j = jsub.add_parser("retry", help="an error or retry job back to pending, due now")
    j.add_argument("job_id", metavar="ID", help=jobids.HELP)


async def dispatch(args: argparse.Namespace) -> int | None:
    """Runs the command if it is one of ours; None otherwise."""

    if args.command == "admin":
        return await serve(args)
    if args.command == "admin-token":
        async with opened(args) as (_db, pool):
            return await token_command(args, pool)
    if args.command == "jobs" and args.jobs_command in ("list", "retry"):
        if args.jobs_command == "retry":  # a malformed id is refused before the database opens
            args.job_ref = jobids.parse(args.job_id)
        async with opened(args) as (_db, pool):
            return await (
                jobs_list(args, pool) if args.jobs_command == "list" else jobs_retry(args, pool)
            )
    return None


async def token_command(args: argparse.Namespace, pool: asyncpg.Pool) -> int:
    if args.token_command == "create":
        workspace = None if args.all else _uuid(args.workspace, "--workspace")
        token = auth.new_token()
        try:
            token_id = await store.create_token(pool, auth.digest(token), workspace, args.label)
        except asyncpg.ForeignKeyViolationError:
            raise UserError(f"no workspace {workspace}") from None
        print(token)
        print(
            f"token id {token_id}: shown once; revoke with `sidelinja-worker admin-token "
            f"revoke {token_id}`",
            file=sys.stderr,
        )
        return 0
    if args.token_command == "revoke":
        if not await store.revoke_token(pool, _uuid(args.token_id, "token id")):
            raise UserError(f"no active token {args.token_id}")
        print("revoked")
        return 0
    tokens = await store.list_tokens(pool)
    for r in tokens:
        scope = "all workspaces" if r["all_workspaces"] else f"workspace {r['workspace_id']}"
        state = f"revoked {r['revoked_at']:%Y-%m-%d %H:%M}" if r["revoked_at"] else "active"
        label = printable(r["label"] or "")
        print(f"{r['id']}  {state:<24} {scope:<46}  {label}".rstrip())  # 46: a workspace's scope
    if not tokens:
        print("no tokens yet: `sidelinja-worker admin-token create --all`", file=sys.stderr)
    return 0


async def jobs_list(args: argparse.Namespace, pool: asyncpg.Pool) -> int:
    # Every row is held in memory to print (past 64 bits, a traceback); none is no list.
    if not 1 <= args.limit <= MAX_LIST:
        raise UserError(f"--limit: 1 to {MAX_LIST:,}")
    f = JobFilter(
        status=None if args.status == "all" else _status(args.status),
        job_type=args.type,
        workspace_id=_uuid(args.workspace, "--workspace") if args.workspace else None,
    )
    async with store.scoped(pool, ALL) as conn:
        rows = [dict(r) for r in await store.list_jobs(conn, f, None, args.limit)]
    if args.json:
        text = json.dumps(rows, default=json_default, ensure_ascii=False, indent=1)
        print(printable_json(text))
        return 0
    print_table(rows)
    return 0


def print_table(rows: list[dict[str, Any]]) -> None:
    if not rows:
        print("no jobs match")
        return
    if sys.stdout.isatty():
        print_fitted(rows, shutil.get_terminal_size().columns)
        return
    # As wide as the longest job type listed: a cut one is a name `--type` does not find.
    width = max(len("TYPE"), *(len(printable(r["job_type"])) for r in rows))
    width = min(width, TYPE_SHOWN)
    print(f"{'ID':<36}  {'TYPE':<{width}} {'STATUS':<9} {'TRIES':>5}  {'CREATED':<19}  LAST ERROR")
    for r in rows:
        error = cut(printable((r["error_msg"] or "").replace("\n", " ")), ERROR_SHOWN)
        print(
            f"{r['id']!s:<36}  {cut(printable(r['job_type']), width):<{width}} {r['status']:<9} "
            f"{r['attempts']:>2}/{r['max_attempts']:<2}  {r['created_at']:%Y-%m-%d %H:%M:%S}  {error}"
        )


def print_fitted(rows: list[dict[str, Any]], columns: int) -> None:
    """The table for a person at a terminal `columns` wide: a whole id is 36 of them, and a
    row the terminal wraps breaks the columns. The ids are short (as the admin view shows them;
    `jobs show` and the other commands take one), the time (UTC, as piped) is to the minute,
    and the last error takes the room left, or a line of its own below its row when less than
    ERROR_MIN is left. A pipe and --json get the whole ids."""
    width = max(len("TYPE"), *(len(printable(r["job_type"])) for r in rows))
    width = max(min(width, TYPE_SHOWN, columns - FITTED_FIXED), len("TYPE"))
    room = columns - FITTED_FIXED - width
    below = room < ERROR_MIN
    error_head = "" if below else "  LAST ERROR"
    head = f"{'ID':<15}  {'TYPE':<{width}} {'STATUS':<9} {'TRIES':>5}  {'CREATED':<11}{error_head}"
    print(head.rstrip())
    if below:
        print(f"{ERROR_INDENT}LAST ERROR")
    for r in rows:
        error = printable((r["error_msg"] or "").replace("\n", " "))
        row = (
            f"{store.short_id(r['id'])}  {cut(printable(r['job_type']), width):<{width}} "
            f"{r['status']:<9} {r['attempts']:>2}/{r['max_attempts']:<2}  "
            f"{r['created_at']:%m-%d %H:%M}"
        )
        if not error:
            print(row)
        elif below:
            print(row)
            print(ERROR_INDENT + cut(error, max(columns - len(ERROR_INDENT), 1)))
        else:
            print(f"{row}  {cut(error, room)}")


def cut(text: str, width: int) -> str:
    """`text` in at most `width` characters, a cut one ending in "…"."""
    return text if len(text) <= width else text[: width - 1] + "…"


async def jobs_retry(args: argparse.Namespace, pool: asyncpg.Pool) -> int:
    job_id = await jobids.resolve(pool, args.job_ref)
    try:
        async with store.scoped(pool, ALL) as conn:
            done = await store.retry_job(conn, job_id)
            if done:
                await store.audit(conn, ALL, "retry", [job_id], {"via": "cli"})
            status = None if done else (await store.get_job(conn, job_id) or {}).get("status")
    except asyncpg.UniqueViolationError:
        raise UserError(f"job {job_id} {store.KEY_HELD}") from None
    if not done:
        raise UserError(
            f"job {job_id} is {status}; only error or retry jobs can be retried"
            if status
            else f"no job {job_id}"
        )
    print("pending: due now")
    return 0


async def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from sidelinja_worker.admin.app import create_app
    from sidelinja_worker.admin.arrival import bounded_h11

    bind = args.settings.admin_bind
    host, _, port = bind.rpartition(":")
    if not host or not port.isdigit():
        raise UserError(f"--bind / SIDELINJA_ADMIN_BIND {bind!r} is not HOST:PORT")
    await check_bind(host.strip("[]"), int(port), bind)
    async with opened(args) as (db, _pool):
        config = uvicorn.Config(
            create_app(db.url, spacetime_target(args.settings), args.settings.admin_read_timeout),
            host=host.strip("[]"),
            port=int(port),
            http=bounded_h11(args.settings.admin_request_timeout),
            log_level="warning",
            timeout_graceful_shutdown=2,
        )
        print(f"sidelinja-worker admin: http://{bind}/admin/jobs", file=sys.stderr, flush=True)
        await uvicorn.Server(config).serve()
    return 0


async def check_bind(host: str, port: int, bind: str) -> None:
    """uvicorn's own bind (the same create_server call), tried first: a port in use or a host
    not on this machine is one line and exit 2, before anything says it serves there. uvicorn
    would log it and exit 3, the code of a worker whose internal task died."""
    try:
        server = await asyncio.get_running_loop().create_server(
            asyncio.Protocol, host=host, port=port
        )
    except OSError as exc:
        raise UserError(f"--bind {bind}: {why_not_listening(exc)}") from None
    server.close()
    await server.wait_closed()


def spacetime_target(s: Settings) -> SpacetimeTarget | None:
    if not s.spacetimedb_url:
        return None
    if not s.spacetimedb_database:
        raise UserError("SPACETIMEDB_URL is set but SPACETIMEDB_DATABASE is not")
    token = s.spacetimedb_token
    return SpacetimeTarget(
        s.spacetimedb_url,
        s.spacetimedb_database,
        s.spacetimedb_reducer,
        Secret(token.get_secret_value()) if token else None,
    )


async def workspaces(pool: asyncpg.Pool) -> list[asyncpg.Record]:
    """Every workspace (`workspace list`), read as a platform admin."""
    async with store.scoped(pool, ALL) as conn:
        return await store.workspaces(conn)


def _uuid(text: str | None, what: str) -> UUID:
    try:
        return UUID(str(text))
    except ValueError:
        raise UserError(f"{what} {text!r} is not a UUID") from None


def _status(text: str) -> str:
    from sidelinja_worker.admin.forms import STATUSES

    if text not in STATUSES:
        raise UserError(f"--status {text!r}: one of {', '.join(STATUSES)} or all")
    return text
