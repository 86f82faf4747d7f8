"""Threads for the handlers' blocking work (`asyncio.to_thread`: parsing a service's answer,
hashing a log batch, reading a file), enough that one slot's thread work never waits for
another's.

asyncio's default pool has min(32, cores + 4) threads: 6 on a 2-core machine. A worker runs
up to --max-concurrent jobs, so six jobs with long thread work (one workspace's big log files,
say) held every thread, and every other job that needed one (each service answer is parsed in
a thread) waited behind them, whatever its workspace; so did the engine's own connects to a
database named by host name (asyncpg resolves it in a thread). With a thread per slot and a
few beyond, each job's thread work starts at once and shares the cores with the rest. Threads
are started as work arrives, so an idle worker keeps only what it used.

A thread cannot be stopped: a blocking call that never returns (a read from a hung network
mount, a C library waiting for ever) outlives the job that made it, which its timeout ended.
The pool counts the work in its threads (`busy`), so that a stopping worker can leave such
work behind instead of waiting for it for ever: asyncio's shutdown and the interpreter's exit
both wait for every thread of the pool. It also knows which job submitted each piece of work
(OWNER, which the worker sets around each job), so that a running worker can tell work its
jobs left behind (`left_behind`): once more of it holds threads than the pool has beyond a
thread per slot, slots wait for threads that never come back, and the worker ends itself
(crash-only) rather than time out every job that needs one."""

from __future__ import annotations

import asyncio
import os
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextvars import ContextVar
from typing import ParamSpec, TypeVar

# Beyond a thread per slot: the engine's name look-ups, and thread work a cancelled job left
# running (a thread cannot be stopped; the bounds on each task keep that to seconds).
THREADS_BEYOND_SLOTS = 8

# The default pool each event loop was given here, so a second worker on the same loop (tests
# run several) only ever grows it.
_LOOP_POOL: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, CountingPool] = (
    weakref.WeakKeyDictionary()
)
# Whose thread work is submitted: the worker sets its own id and the job's around each job
# (the handler's tasks inherit it; several workers may share a loop); None: the engine's own.
OWNER: ContextVar[object] = ContextVar("sidelinja_thread_owner", default=None)

P = ParamSpec("P")
T = TypeVar("T")


class CountingPool(ThreadPoolExecutor):
    """A ThreadPoolExecutor that knows its work queued or running, and whose it is (OWNER)."""

    def __init__(self, max_workers: int, thread_name_prefix: str) -> None:
        super().__init__(max_workers=max_workers, thread_name_prefix=thread_name_prefix)
        self.size = max_workers
        self._lock = threading.Lock()
        self._work: dict[int, object] = {}  # a key per piece of work -> its owner
        self._orphaned: dict[int, float] = {}  # key -> when its owner was first seen gone
        self._keys = 0

    @property
    def busy(self) -> int:
        return len(self._work)

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        owner = OWNER.get()
        with self._lock:
            key = self._keys = self._keys + 1
            self._work[key] = owner
        try:
            future = super().submit(fn, *args, **kwargs)
        except BaseException:
            self._finished(key)
            raise
        future.add_done_callback(lambda _: self._finished(key))
        return future

    def _finished(self, key: int) -> None:
        with self._lock:
            self._work.pop(key, None)
            self._orphaned.pop(key, None)

    def left_behind(self, gone: Callable[[object], bool], for_s: float) -> int:
        """Work whose owner has been `gone` (its job no longer running) for at least `for_s`
        (from the first call that saw it gone). Work with no owner is never counted."""
        now = time.monotonic()
        count = 0
        with self._lock:
            for key, owner in self._work.items():
                if owner is None or not gone(owner):
                    continue
                if now - self._orphaned.setdefault(key, now) >= for_s:
                    count += 1
        return count


def busy() -> int:
    """Thread work queued or running in the running loop's default pool, if made here."""
    pool = _LOOP_POOL.get(asyncio.get_running_loop())
    return 0 if pool is None else pool.busy


async def wait_idle(timeout_s: float, tick_s: float = 0.05) -> int:
    """Waits up to `timeout_s` for the thread work to end; what is still busy then."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while (left := busy()) and loop.time() < deadline:
        await asyncio.sleep(tick_s)
    return left


def left_behind(gone: Callable[[object], bool], for_s: float) -> int:
    """CountingPool.left_behind of the running loop's default pool, if it is one made here."""
    pool = _LOOP_POOL.get(asyncio.get_running_loop())
    return 0 if pool is None else pool.left_behind(gone, for_s)


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
    have = _LOOP_POOL.get(loop)
    if have is not None and have.size >= wanted:
        return have.size
    pool = CountingPool(max_workers=wanted, thread_name_prefix="sidelinja-worker")
    _LOOP_POOL[loop] = pool
    loop.set_default_executor(pool)
    return wanted
