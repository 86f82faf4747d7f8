"""How long the code under test keeps the event loop from other work, from asyncio's own debug
timing of each callback (a step of a task) that runs longer than a threshold."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Iterator
from contextlib import contextmanager

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
