"""Cancel notices: a notification naming a job is a hint to read its row, never a command."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from uuid import UUID

from sidelinja_worker.queue.db import DB_ERRORS

log = logging.getLogger("sidelinja_worker.worker")

# A cancel notice names a job; the job's row is read at most once per this long while more
# notices for it arrive, and once after the last of them.
CANCEL_RECHECK_S = 0.1


class CancelNotices:
    """Turns notices on the cancel channel into reads of the rows they name. Any role may
    NOTIFY any channel, so a notice only makes the worker look: a job is cancelled when its
    row says so (`requested`: `cancel_requested_at` set, still running under this worker), and
    a notice for a job that does not run here (`runs_here`) costs a dict look-up."""

    def __init__(
        self,
        runs_here: Callable[[UUID], bool],
        requested: Callable[[UUID], Awaitable[bool]],
        cancel: Callable[[UUID], None],
    ) -> None:
        self._runs_here = runs_here
        self._requested = requested
        self._cancel = cancel
        self.checking: set[UUID] = set()  # jobs whose row is being read
        self._again: set[UUID] = set()  # ... and noticed again meanwhile
        self._tasks: set[asyncio.Task[None]] = set()

    def notice(self, job_id: UUID) -> None:
        """A notice for `job_id`: its row is read, unless it does not run here or a read of it
        is already under way (then it is read once more after that one)."""
        if not self._runs_here(job_id):
            return
        if job_id in self.checking:
            self._again.add(job_id)
            return
        self.checking.add(job_id)
        check = asyncio.create_task(self._check(job_id), name="cancel-check")
        self._tasks.add(check)
        check.add_done_callback(self._tasks.discard)

    def stop(self) -> None:
        """Cancels the reads under way: at a stop, a cancel matters no more."""
        for check in list(self._tasks):
            check.cancel()

    async def _check(self, job_id: UUID) -> None:
        """Reads the job's row; again after CANCEL_RECHECK_S while notices kept arriving, as
        the read under way may predate the cancel a later notice announces. A stream of
        (forged) notices for one job costs one read per CANCEL_RECHECK_S."""
        try:
            while True:
                self._again.discard(job_id)
                if await self._requested(job_id):
                    self._cancel(job_id)
                    return
                await asyncio.sleep(CANCEL_RECHECK_S)
                if job_id not in self._again or not self._runs_here(job_id):
                    return
        except DB_ERRORS as exc:  # the heartbeat's reconciliation reads it again
            log.debug("job %s: cancel not checked (%s)", job_id, exc)
        finally:
            self.checking.discard(job_id)
            self._again.discard(job_id)
