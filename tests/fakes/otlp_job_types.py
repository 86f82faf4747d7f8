"""The job types of tests/test_tracing.py's worker process, which imports them from here: this
module imports nothing of OpenTelemetry, so that the process shows whether the worker does."""

from __future__ import annotations

import asyncio
from typing import Any

from sidelinja_worker.queue.client import NewJob
from sidelinja_worker.queue.context import JobContext
from sidelinja_worker.queue.errors import Defer
from tests.helpers import job_type


async def _call_out(ctx: JobContext, payload: Any) -> dict[str, int]:
    """Calls the outside service, then queues a follow-up and a child."""
    response = await ctx.services.http.get(payload.url)
    ctx.enqueue_on_success(NewJob(ctx.workspace_id, "traced_next", {"via": "follow-up"}))
    ctx.add_child(NewJob(ctx.workspace_id, "traced_next", {"via": "child"}))
    return {"status": response.status_code}


async def _next(ctx: JobContext, payload: Any) -> dict[str, str]:
    return {"via": payload.via}


async def _broken(ctx: JobContext, payload: Any) -> None:
    raise ValueError("the handler is broken")


async def _slow(ctx: JobContext, payload: Any) -> None:
    await asyncio.sleep(60)  # past its type's timeout: cancelled by the worker


async def _later(ctx: JobContext, payload: Any) -> None:
    raise Defer("the service asked us to wait", after_s=3600)


TEST_TYPES = [
    job_type("traced_call", _call_out),
    job_type("traced_next", _next),
    job_type("traced_broken", _broken),
    job_type("traced_slow", _slow, timeout_s=0.2),
    job_type("traced_later", _later),
]
