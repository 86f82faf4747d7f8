"""Where a drain's CPU goes: the queue's own process and the PostgreSQL server, from /proc.

On 2 cores with the server on the same cores, a drain that keeps both busy runs at about
2 / (CPU per job), so the split says which side a faster drain must come from.

The server's CPU is the postmaster's own, plus that of its children: live ones read directly,
exited ones (every backend that closed) from the postmaster's cutime/cstime, where the kernel
adds a child's time when it is reaped. Read before and after a drain, the difference is what the
server spent on it, the backends that came and went included. Only for a server on this machine
(a loopback or socket connection whose backend we can see); `locate` gives None otherwise.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
from common import spawn, wait_until

CLOCK_TICK = os.sysconf("SC_CLK_TCK")
LOCAL_ADDRESSES = (None, "127.0.0.1", "::1")


def _stat(pid: int) -> tuple[int, float, float]:
    """(parent pid, own CPU s, reaped children's CPU s) from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        text = f.read()
    # The command name may hold spaces and parentheses: the fields start after the last ')'.
    fields = text[text.rindex(")") + 2 :].split()
    return (
        int(fields[1]),
        (int(fields[11]) + int(fields[12])) / CLOCK_TICK,
        (int(fields[13]) + int(fields[14])) / CLOCK_TICK,
    )


def cpu_seconds(pid: int) -> float:
    """CPU seconds process `pid` has used so far (its own, not its reaped children's)."""
    return _stat(pid)[1]


@dataclass(frozen=True)
class ServerCpu:
    postmaster: int

    @classmethod
    async def locate(cls, conn: asyncpg.Connection) -> ServerCpu | None:
        """The server behind `conn`, if it runs on this machine and its processes are visible."""
        address = await conn.fetchval("SELECT host(inet_server_addr())")
        if address not in LOCAL_ADDRESSES:
            return None
        backend = await conn.fetchval("SELECT pg_backend_pid()")
        try:
            parent = _stat(backend)[0]
            with open(f"/proc/{parent}/comm", encoding="utf-8") as f:
                name = f.read().strip()
        except (OSError, ValueError):
            return None  # another PID namespace (a container): nothing to read here
        return cls(parent) if name in ("postgres", "postmaster") else None

    def seconds(self) -> float:
        """CPU seconds the server has used so far (within a clock tick per process)."""
        _, own, reaped = _stat(self.postmaster)
        total = own + reaped
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                parent, cpu, _ = _stat(int(entry.name))
            except (OSError, ValueError):
                continue  # exited while we looked
            if parent == self.postmaster:
                total += cpu
        return total


async def backends_gone(conn: asyncpg.Connection) -> bool:
    """No client backend of conn's database is left but conn's own: a child that exited has
    had its connections closed, so their CPU is in the postmaster's reaped count (or, for a
    moment, in a zombie's, which `seconds` still reads)."""
    return await conn.fetchval(
        "SELECT count(*) = 0 FROM pg_stat_activity WHERE datname = current_database()"
        " AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
    )


def process_seconds() -> float:
    """This process's CPU seconds (all threads): what a child reports of its own run."""
    times = os.times()
    return times.user + times.system


@dataclass(frozen=True)
class CpuSplit:
    """CPU seconds one drain cost: the queue's own process while it ran (a child: its worker's
    run, imports excluded; the bare loop: the loop) and the server (None when it is not on
    this machine)."""

    client_s: float
    server_s: float | None

    def less(self, other: CpuSplit) -> CpuSplit:
        """This split minus `other` (a run on an empty queue: start-up and shutdown)."""
        server_s = (
            self.server_s - other.server_s
            if self.server_s is not None and other.server_s is not None
            else None
        )
        return CpuSplit(self.client_s - other.client_s, server_s)


def median_split(splits: list[CpuSplit]) -> CpuSplit:
    """Each side's median (the two may come from different runs)."""
    servers = [s.server_s for s in splits if s.server_s is not None]
    return CpuSplit(
        statistics.median(s.client_s for s in splits),
        statistics.median(servers) if len(servers) == len(splits) else None,
    )


async def run_measured(
    conn: asyncpg.Connection,
    server: ServerCpu | None,
    script: str,
    *args: str,
    time_limit_s: float = 600.0,
    stderr: Path | None = None,
) -> tuple[float, dict[str, Any], bool, CpuSplit]:
    """Runs bench/`script` (a burst-mode worker child that reports `run_cpu_s`) to its end.
    Returns (wall s, its report, whether it was stopped at `time_limit_s`, its CPU). `conn` is
    on the child's database: the server's CPU is read once the child's connections closed."""
    before_s = server.seconds() if server else 0.0
    child = await spawn(script, *args, stderr=stderr)
    wall_s, report, stopped = await child.finish(time_limit_s)
    await wait_until(lambda: backends_gone(conn), 10, f"{script}'s connections to close")
    server_s = server.seconds() - before_s if server else None
    return wall_s, report, stopped, CpuSplit(report["run_cpu_s"], server_s)
