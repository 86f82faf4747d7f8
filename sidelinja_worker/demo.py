"""`sidelinja-worker demo`: a newcomer's first run. Enqueues sample jobs of every job type that
needs no outside service, runs them live, and prints what they produced. No canned answers."""

from __future__ import annotations

import json
from uuid import UUID

import asyncpg

from sidelinja_worker import client, store
from sidelinja_worker.client import NewJob
from sidelinja_worker.db import Database
from sidelinja_worker.handlers import REGISTRY
from sidelinja_worker.settings import WorkerSettings
from sidelinja_worker.worker import Worker

DEMO_WORKSPACE = UUID("00000000-0000-4000-8000-00000000de00")

SAMPLES = [
    ("hello", {"message": "Hei fra Sidelinja!"}, {}),
    ("slow", {"sleep_ms": 300, "message": "took 300 ms"}, {}),
    ("urgent", {"message": "priority 10 runs first"}, {"priority": 10}),
    ("flaky", {"fail": "the service answered 503"}, {"max_attempts": 1}),
    ("bad input", {"sleep_ms": "soon"}, {}),
    ("refused", {"fail_permanent": "file /media/ep1.mp3 does not exist"}, {}),
]


async def run_demo(db: Database, pool: asyncpg.Pool) -> int:
    await store.ensure_workspace(pool, DEMO_WORKSPACE, "Demo")
    jobs = [NewJob(DEMO_WORKSPACE, "noop", payload, **opts) for _, payload, opts in SAMPLES]
    ids = await client.enqueue_many(pool, jobs)
    print(f"enqueued {len(ids)} sample jobs in workspace {DEMO_WORKSPACE}; running them:\n",
          flush=True)
    worker = Worker(pool, db.url, REGISTRY, WorkerSettings(max_concurrent=3, burst=True,
                                                           poll_interval_s=0.2))
    await worker.run()
    print()
    print(f"{'SAMPLE':<10} {'STATUS':<10} {'TRIES':>5}  RESULT OR ERROR")
    for (label, _payload, _opts), job_id in zip(SAMPLES, ids, strict=True):
        row = await store.get_job(pool, job_id)
        assert row is not None
        outcome = (json.dumps(row["result"], ensure_ascii=False) if row["status"] == "completed"
                   else row["error_msg"])
        print(f"{label:<10} {row['status']:<10} {row['attempts']:>2}/{row['max_attempts']}  {outcome}")
    print("\nNext: `sidelinja-worker types` lists every job type; "
          "`sidelinja-worker jobs show ID` shows one job whole.")
    return 0
