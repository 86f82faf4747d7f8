"""Job ids made by the client: UUIDv7, time-ordered across batches, unique within them."""

from __future__ import annotations

import time
from uuid import UUID

from sidelinja_worker.queue.ids import uuid7s


def _millis(u: UUID) -> int:
    return u.int >> 80


def test_ids_are_version_7_with_the_rfc_variant() -> None:
    for u in uuid7s(1000):
        assert u.version == 7
        assert u.variant == "specified in RFC 4122"


def test_ids_carry_the_current_millisecond_and_later_batches_sort_later() -> None:
    before = time.time_ns() // 1_000_000
    first = uuid7s(100)
    later = uuid7s(1)[0]
    after = time.time_ns() // 1_000_000
    assert all(before <= _millis(u) <= after for u in first)
    # A later batch never sorts before an earlier one (the millisecond comes first).
    assert _millis(later) >= max(_millis(u) for u in first)
    time.sleep(0.002)  # the next millisecond: what the assertion below is about
    assert uuid7s(1)[0] > max(first)


def test_a_batch_has_no_repeats() -> None:
    ids = uuid7s(200_000)
    assert len(set(ids)) == len(ids)
