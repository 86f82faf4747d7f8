"""Reads a process's memory from /proc; imported by the worker children, so it imports nothing."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Memory:
    rss_kb: int  # resident now (VmRSS)
    hwm_kb: int  # peak resident since start (VmHWM)


def read_memory(pid: int | None = None) -> Memory:
    fields: dict[str, int] = {}
    with open(f"/proc/{pid or os.getpid()}/status", encoding="ascii") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0])
    return Memory(rss_kb=fields["VmRSS"], hwm_kb=fields["VmHWM"])


def print_report(**extra: object) -> None:
    """The child's last stdout line: its memory at exit plus `extra`, as JSON for the parent."""
    print(json.dumps({**asdict(read_memory()), **extra}), flush=True)
