"""How many jobs a worker claims ahead of its free slots, and how many one claim asks for."""

from __future__ import annotations

# Jobs that take less than this on average are claimed ahead, so the next batch is in hand when
# the current one ends and the claim's round trip overlaps with running jobs. Longer jobs are
# never hoarded from other workers.
PREFETCH_BELOW_S = 0.005
PREFETCH_MIN = 64  # even a worker of concurrency 1 claims short jobs in batches
# Held jobs are bounded by time and by count: at most PREFETCH_WORK_S of work (at the moving
# average run time, spread over the slots) and at most PREFETCH_MAX jobs wait here. So a job of
# another workspace claimed next waits behind no more than that: 50 ms of work, or, for jobs
# shorter than the worker's own cost of running one (~15 µs a noop here), 4,000 jobs, which
# this machine starts in 55-160 ms (70,000 jobs/s on a quiet hour, 25,000 on a slow one). Big
# claims are what make short jobs cheap: the per-statement costs (round trip, commit, trigger,
# the fair claim's sorts) are shared by more jobs. Drains of 20,000 noop jobs at concurrency 50,
# claims of 1,000 / 2,000 / 4,000 alternated in six rounds: 70,300 / 74,600 / 75,800 jobs/s
# with one workspace, and 65,100 / 68,000 for 1,000 / 2,000 over ten; 4,000 gained too little
# for twice the hoard. (A bound by the measured start rate instead of PREFETCH_MAX ramped up
# too slowly for a 20,000-job drain: 5 % slower.)
PREFETCH_WORK_S = 0.05
PREFETCH_MAX = 4000
CLAIM_MIN = 32  # the least a claim asks for when prefetching
CLAIM_MAX = 2000


def prefetch(max_concurrent: int, job_time_s: float, capped: bool) -> int:
    """Jobs to hold beyond the free slots: at least twice the concurrency, so that when a
    claim's answer arrives the next claim goes out at once and is on the wire while the slots
    run the batch just received; more for very short jobs, up to PREFETCH_WORK_S of work. None
    for longer jobs, or while a cap is counted (jobs held here would count against it)."""
    if job_time_s > PREFETCH_BELOW_S or capped:
        return 0
    by_time = int(max_concurrent * PREFETCH_WORK_S / max(job_time_s, 1e-6))
    return max(2 * max_concurrent, PREFETCH_MIN, min(by_time, PREFETCH_MAX))


def claim_size(max_concurrent: int, prefetched: int) -> int:
    """The most one claim asks for: a slot-full, or half the prefetch for short jobs (so one
    claim is in flight while the slots run the other half)."""
    return max(max_concurrent, CLAIM_MIN, min(prefetched // 2, CLAIM_MAX))
