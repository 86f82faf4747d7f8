"""How long the code under test keeps the event loop from other work, from asyncio's own debug
timing of each callback (a step of a task) that runs longer than a threshold, or from how late
a task that only sleeps wakes; and how much memory it takes at its peak."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

# Steps shorter than this are not recorded: logging every one would slow the run it measures.
RECORDED_OVER_S = 0.02


@contextmanager
def longest_stall() -> Iterator[list[float]]:
    """Yields a one-item list that holds, once the block ends, the longest time in seconds one
    step on the running event loop took while the block ran (0.0 if none took
    RECORDED_OVER_S). The garbage collector is off meanwhile: a full collection in a test
    process (~0.1 s) is no stall of the code under test, and a worker tunes its collector for
    that (queue/gctune.py)."""
    loop = asyncio.get_running_loop()
    longest = [0.0]

    class Record(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            # BaseEventLoop._run_once logs "Executing %s took %.3f seconds" in debug mode.
            if record.msg == "Executing %s took %.3f seconds" and isinstance(record.args, tuple):
                longest[0] = max(longest[0], float(record.args[1]))

    handler = Record(logging.WARNING)
    logger = logging.getLogger("asyncio")
    debug, threshold = loop.get_debug(), loop.slow_callback_duration
    collecting = gc.isenabled()
    logger.addHandler(handler)
    loop.set_debug(True)
    loop.slow_callback_duration = RECORDED_OVER_S
    gc.disable()
    try:
        yield longest
    finally:
        if collecting:
            gc.enable()
        loop.slow_callback_duration = threshold
        loop.set_debug(debug)
        logger.removeHandler(handler)


@contextmanager
def peak_memory() -> Iterator[list[int]]:
    """Yields a one-item list that holds, once the block ends, the most memory the process
    held at once while it ran (its resident set), over what it held when it began. Linux's own
    count, reset for the block: tracemalloc slows every allocation, and with it the steps the
    test times."""
    Path("/proc/self/clear_refs").write_text("5")  # the peak starts again from now
    base = _status_bytes("VmRSS")
    peak = [0]
    try:
        yield peak
    finally:
        peak[0] = _status_bytes("VmHWM") - base


def _status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024  # "VmRSS:   123456 kB"
    raise LookupError(field)


@asynccontextmanager
async def longest_gap(tick_s: float = 0.001) -> AsyncIterator[list[float]]:
    """Yields a one-item list that holds, once the block ends, the longest time in seconds a
    task that sleeps `tick_s` at a time woke late. It sees what the debug timing of a step does
    not: another thread holding the GIL (a C call such as json.loads never hands it over)
    between two steps, while the loop waits to take it back. The garbage collector is off
    meanwhile, as in `longest_stall`: a full collection of earlier tests' garbage (a few tenths
    of a second in a long test run) is no stall of the code under test."""
    longest = [0.0]
    done = asyncio.Event()

    async def tick() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(tick_s)
            now = time.perf_counter()
            longest[0] = max(longest[0], now - last - tick_s)
            last = now

    collecting = gc.isenabled()
    gc.disable()
    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0)  # the ticker is running before the block begins
    try:
        yield longest
    finally:
        done.set()
        await ticker
        if collecting:
            gc.enable()
