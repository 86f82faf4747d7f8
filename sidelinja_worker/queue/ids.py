"""Job ids as UUIDv7 (RFC 9562): 48 bits of Unix milliseconds, then 74 random bits.

Why not uuid4: `job_queue`'s primary key is a B-tree, and every claim and completion is a
non-HOT update (the status is indexed), so each adds a new entry for the job's id next to the
old one. With random ids those entries land on random leaf pages of the whole index; with
time-ordered ids the jobs claimed together sit together, and a bulk enqueue appends to the
index's right edge. Measured on the 2-core machine with a SQL-only drain of 20,000 jobs in
claims of 500: PostgreSQL's CPU per job 54-58 µs with uuid4, 44.5 µs with these.
A plain-SQL insert keeps the table's original `gen_random_uuid()` default; both kinds of id live
side by side in the same column. An id made here
reveals when the job was enqueued, to the millisecond, which `created_at` shows anyway."""

from __future__ import annotations

import os
import time
from uuid import UUID

_VERSION_AND_VARIANT = (0x7 << 76) | (0b10 << 62)
_RAND_A = 0xFFF  # 12 bits after the version
_RAND_B = (1 << 62) - 1  # 62 bits after the variant


def uuid7s(n: int) -> list[UUID]:
    """n new ids sharing the current millisecond; random, not monotonic, within it."""
    head = ((time.time_ns() // 1_000_000) << 80) | _VERSION_AND_VARIANT
    noise = os.urandom(10 * n)  # one system call for the batch, not one per id
    from_bytes = int.from_bytes
    ids = []
    for i in range(0, 10 * n, 10):
        r = from_bytes(noise[i : i + 10])
        ids.append(UUID(int=head | ((r >> 62) & _RAND_A) << 64 | (r & _RAND_B)))
    return ids
