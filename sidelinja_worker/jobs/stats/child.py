"""`python -m sidelinja_worker.jobs.stats.child`: one parse in its own process, so the worker's event
loop and its other jobs never wait on the CPU-bound part. Pickled (tasks, rules, spill folder,
spill threshold) in on stdin,
a pickled ParseResult (or ("error", message)) out on stdout."""

from __future__ import annotations

import pickle
import sys

from sidelinja_worker.jobs.stats.logfiles import utf8_text
from sidelinja_worker.jobs.stats.parse import parse_files


def main() -> None:
    tasks, rules, spill_dir, spill_at = pickle.load(sys.stdin.buffer)
    try:
        result: object = parse_files(tasks, rules, spill_dir, spill_at)
    except Exception as exc:  # damaged files are handled inside; this is the same on a retry
        result = ("error", utf8_text(f"{type(exc).__name__}: {exc}"))
    pickle.dump(result, sys.stdout.buffer, protocol=pickle.HIGHEST_PROTOCOL)


if __name__ == "__main__":
    main()
