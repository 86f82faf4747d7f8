"""`python -m sidelinja_worker.jobs.stats.child PARENT_PID`: one parse in its own process, so
the worker's event loop and its other jobs never wait on the CPU-bound part. Pickled (tasks,
rules, spill folder, spill threshold) in on stdin, a pickled ParseResult (or ("error",
message)) out on stdout."""

from __future__ import annotations

import os
import pickle
import sys
import threading
import time

from sidelinja_worker.jobs.stats.logfiles import utf8_text
from sidelinja_worker.jobs.stats.parse import parse_files

PARENT_CHECK_S = 0.5


def exit_with_parent(parent: int) -> None:
    """Ends this process within PARENT_CHECK_S once `parent`, the worker that started it, is
    no longer its parent: a worker killed (kill -9, the OOM killer) left its parse running
    for as long as the logs took, minutes of a core for an answer nobody reads, while the
    rescued job parsed the same logs again elsewhere (or beside it). The parent names itself
    on the command line: a parent killed while this process was still starting would
    otherwise leave it taking its new parent for its own. A thread watches, as the parse
    holds the GIL only between its lines, and Linux's parent-death signal is Linux's alone."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_S)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def main() -> None:
    exit_with_parent(int(sys.argv[1]) if len(sys.argv) > 1 else os.getppid())
    tasks, rules, spill_dir, spill_at, last_day = pickle.load(sys.stdin.buffer)
    try:
        result: object = parse_files(tasks, rules, spill_dir, spill_at, last_day)
    except Exception as exc:  # damaged files are handled inside; this is the same on a retry
        result = ("error", utf8_text(f"{type(exc).__name__}: {exc}"))
    pickle.dump(result, sys.stdout.buffer, protocol=pickle.HIGHEST_PROTOCOL)


if __name__ == "__main__":
    main()
