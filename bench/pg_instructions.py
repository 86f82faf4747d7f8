"""PostgreSQL's own work per job, in instructions: repeatable where the clock is not.

    python bench/pg_instructions.py [--jobs 5000] [--batch 1000] [--workspaces 1 10]
    python bench/pg_instructions.py --pieces [TEXT] [--claims claim_fair --workspaces 10]

On this VM the same drain runs up to 2x faster or slower from one minute to the next (steal
time), so a change of a few percent in what PostgreSQL does per job cannot be seen in jobs/s.
callgrind counts instructions instead: the same binary, data and statements give the same count
to within 0.1 %, whatever else the machine does.

It makes a throwaway cluster with the local server's binaries (`--pg-bin`, default: the newest
/usr/lib/postgresql/*/bin), applies the migrations, and for each claim (the plain one and the
fair one the worker runs by default) and each number of workspaces, queues `--jobs` noop jobs
with time-ordered ids (as the Python client makes them), dealt round-robin over the workspaces,
then drains them in one single-user backend under callgrind with the worker's own statements:
the claim of `--batch` from sql/queries.sql and the completion store.py sends, with generic
plans, each batch completed after the next is claimed (as a prefetching worker does). Only the
drain is counted. Needs valgrind; as root, runs the server as the `postgres` user. About 20 s
per row.

With --pieces it also drains once per piece of the hot path with that piece taken away (a
trigger, an index, a setting: PIECES), each on a fresh copy of the migrated cluster, and prints
what each piece costs per job: the difference to the full schema (with TEXT, only the pieces
whose name contains it). The last few entries are candidates rather than pieces (a fillfactor):
their "cost" is the saving of not having them, negative when they would cost."""

from __future__ import annotations

import argparse
import asyncio
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from sidelinja_worker.queue import migrate
from sidelinja_worker.queue.db import init_connection
from sidelinja_worker.queue.queries import QUERIES
from sidelinja_worker.queue.store import COMPLETE_QUIET

DATABASE = "bench"
# The statements' parameters as the procedure's variables (names no column has).
PARAMS = {"$1": "v_worker", "$2": "v_batch", "$3": "v_types", "$4": "v_now"}


def _graph_elsewhere() -> str:
    """A finished parent and its child, of a type no claim asks for, in a workspace of their
    own."""
    return (
        "WITH w AS (INSERT INTO workspaces (name) VALUES ('graph elsewhere') RETURNING id),"
        " j AS (INSERT INTO job_queue (workspace_id, job_type, payload, status, completed_at)"
        " SELECT w.id, 'elsewhere', jsonb_build_object('n', n), 'completed', now()"
        " FROM w, generate_series(1, 2) n RETURNING id, payload)"
        " INSERT INTO job_dependencies (parent_id, child_id)"
        " SELECT p.id, c.id FROM j p, j c WHERE p.payload->>'n' = '1' AND c.payload->>'n' = '2';"
    )


# Each piece of PostgreSQL's work per job, as the SQL that takes it away.
PIECES = {
    "status events (the two transition-table triggers)": (
        "DROP TRIGGER job_queue_status_events ON job_queue;\n\n"
        "DROP TRIGGER job_queue_insert_events ON job_queue;"
    ),
    "status events switched off (job_events = false)": (
        "UPDATE queue_settings SET value = 'false' WHERE name = 'job_events';"
    ),
    # The default is auto with no listener registered; this "piece" adds the events back (a
    # negative cost), as every listener being registered or `job_events` = true would.
    "status events published (job_events = true)": (
        "UPDATE queue_settings SET value = 'true' WHERE name = 'job_events';"
    ),
    "wake-up triggers (job_due)": (
        "DROP TRIGGER job_queue_insert_notify ON job_queue;\n\n"
        "DROP TRIGGER job_queue_update_notify ON job_queue;"
    ),
    "the workflow trigger (job_queue_parent_changed, its WHEN on has_children)": (
        "DROP TRIGGER job_queue_parent_changed ON job_queue;"
    ),
    "idx_job_queue_admin_pending_by_id": "DROP INDEX idx_job_queue_admin_pending_by_id;",
    "the six admin error/retry/cancelled indexes": (
        "DROP INDEX idx_job_queue_admin_error, idx_job_queue_admin_error_ws,"
        " idx_job_queue_admin_retry, idx_job_queue_admin_retry_ws,"
        " idx_job_queue_admin_cancelled, idx_job_queue_admin_cancelled_ws;"
    ),
    "idx_job_queue_running (the lease's index)": "DROP INDEX idx_job_queue_running;",
    "idx_job_queue_finished": "DROP INDEX idx_job_queue_finished;",
    "idx_job_queue_unique_key": "DROP INDEX idx_job_queue_unique_key;",
    "idx_job_queue_workspace_pending (the fair claim's)": (
        "DROP INDEX idx_job_queue_workspace_pending;"
    ),
    "row-level security": "ALTER TABLE job_queue DISABLE ROW LEVEL SECURITY;",
    "idx_job_queue_pending (the plain claim's)": "DROP INDEX idx_job_queue_pending;",
    # A dropped column is stored as a null in new row versions: what carrying it costs.
    "the error history column (errors, '[]' in every row version)": (
        "ALTER TABLE job_queue DROP COLUMN errors CASCADE;"
    ),
    # Not pieces but candidates, as "the cost of not having them" (negative: they would cost).
    "fillfactor 100, against 85": "ALTER TABLE job_queue SET (fillfactor = 85);",
    "fillfactor 100, against 70": "ALTER TABLE job_queue SET (fillfactor = 70);",
    # Graphs in use (negative: they cost). The drain's TRUNCATE of job_queue leaves the edges
    # (job_dependencies has no foreign key): edges exist, nothing waits.
    "no edge anywhere, against edges (graphs in use, none waiting)": _graph_elsewhere(),
}


@dataclass(frozen=True)
class Row:
    claim: str
    workspaces: int
    instructions_per_job: int
    without: str = ""  # the piece taken away (PIECES), or "" for the full schema


def _server_bin(given: str | None) -> Path:
    if given:
        return Path(given)
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]))
    if not found:
        sys.exit("no PostgreSQL server binaries found; give --pg-bin")
    return Path(found[-1])


def _as_server_user(cmd: list[str]) -> list[str]:
    """initdb and postgres refuse to run as root."""
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


def _with_variables(sql: str) -> str:
    for name in sorted(PARAMS, key=len, reverse=True):
        sql = sql.replace(name, PARAMS[name])
    return sql


def drain_procedure(claim_query: str) -> str:
    """A procedure that drains the queue with `claim_query` and the worker's completion."""
    head, update = _with_variables(QUERIES[claim_query]).split("\nUPDATE job_queue\n", 1)
    update = "UPDATE job_queue\n" + update.rstrip().rstrip(";")
    with_clause = head.strip() + ",\n" if "WITH" in head else "WITH "
    claim = f"{with_clause}claimed AS ({update})\nSELECT array_agg(id) INTO ids FROM claimed"
    complete = (
        COMPLETE_QUIET.replace("$1", "prev")
        .replace("$2", "array_fill(NULL::jsonb, ARRAY[cardinality(prev)])")
        .replace("$3", "v_worker")
    )
    return f"""
CREATE PROCEDURE drain_{claim_query}(v_batch int)
LANGUAGE plpgsql AS $proc$
DECLARE
    v_worker uuid := gen_random_uuid();
    v_types text[] := ARRAY['noop'];
    v_now timestamptz;  -- NULL: the claims read the database clock
    ids uuid[];
    prev uuid[];
BEGIN
    SET plan_cache_mode = force_generic_plan;  -- as the worker's claim pool
    INSERT INTO job_workers (id, hostname, pid, job_types, expires_at)
    VALUES (v_worker, 'bench', 1, NULL, now() + interval '1 hour');
    COMMIT;
    LOOP
        prev := ids;
        {claim};
        COMMIT;
        IF prev IS NOT NULL THEN
            {complete};
            COMMIT;
        END IF;
        EXIT WHEN ids IS NULL;
    END LOOP;
END
$proc$;
"""


class Cluster:
    """A throwaway data directory, started only to set it up."""

    def __init__(self, bin_dir: Path, root: Path) -> None:
        self.bin = bin_dir
        self.root = root
        self.data = root / "data"

    def _run(self, *cmd: str) -> None:
        subprocess.run(_as_server_user(list(cmd)), check=True, stdout=subprocess.DEVNULL)

    def init(self) -> None:
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres")
        self._run(str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust")

    async def set_up(self, workspaces: int) -> list[str]:
        options = f"-c listen_addresses='' -k {self.root} -c fsync=off"
        self._run(
            str(self.bin / "pg_ctl"),
            "-D",
            str(self.data),
            "-o",
            options,
            "-w",
            "-l",
            str(self.root / "log"),
            "start",
        )
        try:
            conn = await asyncpg.connect(host=str(self.root), user="postgres", database="postgres")
            await conn.execute(f"CREATE DATABASE {DATABASE}")
            await conn.close()
            conn = await asyncpg.connect(host=str(self.root), user="postgres", database=DATABASE)
            await init_connection(conn)
            await migrate.apply_all(conn)
            ids = [
                str(r[0])
                for r in await conn.fetch(
                    "INSERT INTO workspaces (name) SELECT 'bench-' || i"
                    " FROM generate_series(1, $1) i RETURNING id",
                    workspaces,
                )
            ]
            for claim in ("claim", "claim_fair"):
                await conn.execute(drain_procedure(claim))
            await conn.close()
        finally:
            self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-w", "stop")
        return sorted(ids)

    def copy(self, name: str) -> Cluster:
        """A copy of the (stopped) cluster, to change without touching this one."""
        other = Cluster(self.bin, self.root)
        other.data = self.root / name
        shutil.rmtree(other.data, ignore_errors=True)
        self._run("cp", "-a", str(self.data), str(other.data))
        return other

    def count(self, script: str, out: Path) -> int:
        """Runs `script` in a single-user backend; the instructions spent inside CALLs."""
        (self.root / "script.sql").write_text(script)
        cmd = _as_server_user(
            [
                "valgrind",
                "--tool=callgrind",
                "--collect-atstart=no",
                "--toggle-collect=ExecuteCallStmt",
                f"--callgrind-out-file={out}",
                str(self.bin / "postgres"),
                "--single",
                "-j",
                "-D",
                str(self.data),
                "-c",
                "fsync=off",
                "-c",
                "jit=off",
                DATABASE,
            ]
        )
        with open(self.root / "script.sql") as stdin:
            done = subprocess.run(cmd, stdin=stdin, capture_output=True, text=True)
        if done.returncode != 0 or "ERROR:" in done.stdout:
            raise RuntimeError(
                f"single-user run failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
            )
        summary = re.search(r"^(?:summary|totals): (\d+)", out.read_text(), re.MULTILINE)
        assert summary is not None, out
        return int(summary.group(1))


def drain_script(claim_query: str, jobs: int, batch: int, workspaces: list[str]) -> str:
    spaces = "ARRAY[" + ",".join(f"'{w}'::uuid" for w in workspaces) + "]"
    # Statements end with a semicolon and an empty line (single-user mode's -j).
    return f"""TRUNCATE job_queue, job_workers;

INSERT INTO job_queue (id, workspace_id, job_type, payload)
SELECT ('0190' || lpad(to_hex(i), 28, '0'))::uuid, ({spaces})[1 + i % {len(workspaces)}],
       'noop', '{{}}'
FROM generate_series(1, {jobs}) i;

ANALYZE job_queue;

CHECKPOINT;

CALL drain_{claim_query}({batch});

DO $$ BEGIN
    IF (SELECT count(*) FROM job_queue WHERE status = 'completed') <> {jobs} THEN
        RAISE EXCEPTION 'the drain did not complete every job';
    END IF;
END $$;

"""


async def measure(args: argparse.Namespace) -> list[Row]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="sw_pg_instr_") as tmp:
        cluster = Cluster(_server_bin(args.pg_bin), Path(tmp))
        cluster.init()
        spaces = await cluster.set_up(max(args.workspaces))
        chosen = [(k, v) for k, v in PIECES.items() if args.pieces is not None and args.pieces in k]
        pieces = [("", ""), *chosen]
        for claim in args.claims:
            for n in args.workspaces:
                for i, (piece, removal) in enumerate(pieces):
                    script = drain_script(claim, args.jobs, args.batch, spaces[:n])
                    target = cluster
                    if removal:
                        target = cluster.copy(f"data_{i}")
                        script = f"{removal}\n\n{script}"
                    out = Path(args.keep or tmp) / f"callgrind.{claim}.{n}.{i}"
                    total = target.count(script, out)
                    if removal:
                        shutil.rmtree(target.data, ignore_errors=True)
                    rows.append(Row(claim, n, round(total / args.jobs), piece))
                    print(
                        f"  {claim}, {n} workspaces{', without ' + piece if piece else ''}: "
                        f"{rows[-1].instructions_per_job:,}",
                        file=sys.stderr,
                        flush=True,
                    )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--batch", type=int, default=1000, help="jobs per claim")
    parser.add_argument("--workspaces", type=int, nargs="+", default=[1, 10])
    parser.add_argument(
        "--claims", nargs="+", choices=["claim", "claim_fair"], default=["claim", "claim_fair"]
    )
    parser.add_argument("--pg-bin", help="folder of initdb, pg_ctl and postgres")
    parser.add_argument(
        "--pieces",
        nargs="?",
        const="",
        metavar="TEXT",
        help="also drain without each piece of PIECES (those whose name contains TEXT)",
    )
    parser.add_argument(
        "--keep",
        metavar="DIR",
        help="write the callgrind profiles here (callgrind_annotate reads them)",
    )
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is needed (apt install valgrind)")
    rows = asyncio.run(measure(args))
    print(
        f"PostgreSQL instructions per job (claim + completion), {args.jobs:,} noop jobs, "
        f"claims of {args.batch:,}:\n"
    )
    print("| claim | workspaces | without | instructions per job | the piece's cost |")
    print("|---|---:|---|---:|---:|")
    full = {(r.claim, r.workspaces): r.instructions_per_job for r in rows if not r.without}
    for r in rows:
        cost = full[(r.claim, r.workspaces)] - r.instructions_per_job
        print(
            f"| {r.claim} | {r.workspaces} | {r.without or '(nothing: the full schema)'} "
            f"| {r.instructions_per_job:,} | {f'{cost:,}' if r.without else ''} |"
        )


if __name__ == "__main__":
    main()
