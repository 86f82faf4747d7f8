"""The `run` command's collector settings, in a fresh interpreter (they are process-wide)."""

from __future__ import annotations

import subprocess
import sys


def test_serving_freezes_start_up_objects_and_collects_young_ones_less_often() -> None:
    code = (
        "import gc; from sidelinja_worker.queue.gctune import YOUNG_THRESHOLD, tune_for_serving;"
        "before = gc.get_threshold(); tune_for_serving();"
        "after = gc.get_threshold();"
        "assert gc.get_freeze_count() > 1000, gc.get_freeze_count();"
        "assert after == (YOUNG_THRESHOLD, *before[1:]), (before, after);"
        "a = []; a.append(a); del a;"  # a cycle is still collected
        "assert gc.collect() >= 1"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
