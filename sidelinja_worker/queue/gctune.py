"""Python's garbage collector set for a long-running worker process.

A draining worker allocates a few dozen container objects per job (a claimed row, a context, a
payload model, an outcome), nearly all freed at once by reference counting. With the default
threshold (700) the collector still ran ~100 times per 20,000 noop jobs, now and then a full
collection over every object the process made at start-up (modules, pydantic schemas): 50-120
ms per 20,000 jobs, 2.5-6 µs a job, about a tenth of the worker's Python time. After start-up
its objects are frozen (never scanned again) and the young generation may hold 10,000 objects
before a collection: one or two collections per drain, under a millisecond. Cycles are still
collected; they just wait a little longer. Only the `run` command (and the benchmark's copy of
it) calls this: a library user's process keeps its own settings."""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 10_000


def tune_for_serving() -> None:
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
