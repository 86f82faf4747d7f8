"""The stats parser's child process does not outlive the worker that started it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

PARENT = """
import os, subprocess, sys, time
fd = int(sys.argv[1])
child = subprocess.Popen(
    [sys.executable, "-m", "sidelinja_worker.jobs.stats.child", str(os.getpid())],
    stdin=fd,
    pass_fds=(fd,),
)
print(child.pid, flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie waiting for a reaper that is not ours counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def test_the_parser_child_ends_when_its_worker_is_killed() -> None:
    """A worker killed (kill -9, the OOM killer) while its parser child ran left the child
    parsing for as long as the logs took, minutes of a core for an answer nobody reads, while
    the rescued job parsed the same logs again. Here the child waits for its input on a pipe
    this test keeps open (as a long parse keeps it busy); its parent is killed as soon as the
    child has started, before it has even read its input; it must end within a few
    seconds."""
    read_end, write_end = os.pipe()
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(read_end)],
        pass_fds=(read_end,),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        os.close(read_end)
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        deadline = time.monotonic() + 30
        while "sidelinja_worker.jobs.stats.child" not in Path(f"/proc/{child}/cmdline").read_text(
            errors="replace"
        ).replace("\0", " "):
            assert time.monotonic() < deadline, "the child never started"
            time.sleep(0.02)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 10
        while _alive(child):
            assert time.monotonic() < deadline, "the child outlived its parent by 10 s"
            time.sleep(0.05)
    finally:
        parent.kill()
        parent.wait()
        assert parent.stdout is not None
        parent.stdout.close()
        os.close(write_end)
