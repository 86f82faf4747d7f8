"""Bounds on the admin's requests: how long one may take to arrive, how long any read runs, and
how many of the heavy ones (job lists, bulk retries, the overview, the dashboard, /metrics) run
at once, in all and per token."""

from __future__ import annotations

import asyncio
import functools
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from uuid import UUID

from starlette.requests import Request
from starlette.responses import Response

# A job list may read a status's whole index: a payload search over all time, or a small
# workspace's completed jobs under row-level security (0.5 s at 1,000,000 jobs, growing with the
# table); the overview, dashboard and /metrics count the whole table (0.6-1.0 s there). Sixteen
# at once held every connection of the pool (8) and a job page waited 3-7 s. READS_MAX run at
# once, the rest wait without a connection, leaving the pool to the other pages; a token that
# asks for more than READS_PER_TOKEN at once is refused (429).
READS_MAX = 4
READS_PER_TOKEN = 2
# Every statement of a page gives up after READ_TIMEOUT_S (`admin --read-timeout`): PostgreSQL's
# statement_timeout on the admin pool's connections, which counts a wait for a lock too, so no
# separate lock_timeout. Unbounded, a read held by a lock (a migration's, a long transaction's)
# kept its request and a connection of the pool for as long as the lock was held. The heavy
# reads above take 0.5-1.0 s at 1,000,000 jobs: 20 s leaves them room to grow twentyfold, and a
# page that needs more wants a narrower filter (the page says so, with a 503).
READ_TIMEOUT_S = 20.0
# A page's work as a whole, its wait for a place among the heavy reads included, ends this long
# past the read bound (see within_read_bound): enough for PostgreSQL's own cancel, cleaner, to
# answer first when one statement is the slow one.
PAGE_GRACE_S = 0.5
# Actions that change rows (retry, cancel, bulk retry) run under their own bound in their own
# transaction, never below the read bound: a cancel runs through the job's graph, 5.1 s for
# a head with 100,000 waiting children, 0.5 s for 10,000 (a retry of it brings them back in
# 3.6 s); a bulk retry of actions.BULK_LIMIT jobs takes 0.14 s without graphs.
ACTION_TIMEOUT_S = 60.0
# How long a request's head and body may take to arrive (`admin --request-timeout`; see
# arrival.py): a form of at most a megabyte arrives in well under a second on any link a person
# administers a queue from.
REQUEST_ARRIVAL_S = 15.0


class Busy(Exception):
    """The token has READS_PER_TOKEN heavy reads running or waiting already."""


class Gate:
    def __init__(self, total: int = READS_MAX, per_token: int = READS_PER_TOKEN) -> None:
        self._slots = asyncio.Semaphore(total)
        self._per_token = per_token
        self._asked: Counter[UUID | None] = Counter()  # reads running or waiting, per token

    @asynccontextmanager
    async def slot(self, token_id: UUID | None) -> AsyncIterator[None]:
        """A place to run one heavy read, waited for; Busy if the token holds its share
        already."""
        if self._asked[token_id] >= self._per_token:
            raise Busy(f"this token has {self._per_token} heavy pages loading; try again")
        self._asked[token_id] += 1
        try:
            async with self._slots:
                yield
        finally:
            self._asked[token_id] -= 1
            if not self._asked[token_id]:
                del self._asked[token_id]


Page = Callable[[Request], Awaitable[Response]]


def within_read_bound(page: Page) -> Page:
    """`page` (a read: it changes no row) under one deadline, the read bound plus PAGE_GRACE_S,
    for all its work. Each statement's own bound is the read bound too, so a page of several
    statements (the overview runs six, a list of every status up to seven), or one waiting for a
    place behind the heavy reads, took up to that many times the bound. Past the deadline the
    page's statement is cancelled and the page is the read bound's 503, naming this bound."""

    @functools.wraps(page)
    async def bounded(request: Request) -> Response:
        bound_s = float(request.app.state.read_timeout_s) + PAGE_GRACE_S
        deadline = asyncio.timeout(bound_s)
        try:
            async with deadline:
                return await page(request)
        except TimeoutError:
            if deadline.expired():  # not a statement's own timeout (a dead connection's)
                request.state.bound_s = bound_s
            raise

    return bounded
