"""Threads for the handlers' blocking work (`asyncio.to_thread`: parsing a service's answer,
hashing a log batch, reading a file), enough that one slot's thread work never waits for
another's.

asyncio's default pool has min(32, cores + 4) threads: 6 on a 2-core machine. A worker runs
up to --max-concurrent jobs, so six jobs with long thread work (one workspace's big log files,
say) held every thread, and every other job that needed one (each service answer is parsed in
a thread) waited behind them, whatever its workspace; so did the engine's own connects to a
database named by host name (asyncpg resolves it in a thread). With a thread per slot and a
few beyond, each job's thread work starts at once and shares the cores with the rest. Threads
are started as work arrives, so an idle worker keeps only what it used."""

from __future__ import annotations

import asyncio
import os
import weakref
from concurrent.futures import ThreadPoolExecutor

# Beyond a thread per slot: the engine's name look-ups, and thread work a cancelled job left
# running (a thread cannot be stopped; the bounds on each task keep that to seconds).
THREADS_BEYOND_SLOTS = 8

# The size each event loop's default pool was given here, so a second worker on the same loop
# (tests run several) only ever grows it.
_SIZED: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, int] = weakref.WeakKeyDictionary()


def threads_for(max_concurrent: int) -> int:
    """A thread per slot and THREADS_BEYOND_SLOTS more, and never fewer than asyncio's own
    default (min(32, cores + 4)) on a machine with many cores."""
    return max(max_concurrent + THREADS_BEYOND_SLOTS, min(32, (os.cpu_count() or 1) + 4))


def size_default_pool(max_concurrent: int) -> int:
    """Gives the running loop's default pool at least `threads_for(max_concurrent)` threads;
    returns its size. A pool replaced here is not shut down: work already in it finishes, and
    its idle threads end once it is collected. The loop's owner (asyncio.run) shuts the last
    one down."""
    loop = asyncio.get_running_loop()
    wanted = threads_for(max_concurrent)
    have = _SIZED.get(loop, 0)
    if have >= wanted:
        return have
    loop.set_default_executor(
        ThreadPoolExecutor(max_workers=wanted, thread_name_prefix="sidelinja-worker")
    )
    _SIZED[loop] = wanted
    return wanted
