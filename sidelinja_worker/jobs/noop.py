"""`noop`: returns its payload. The probe for health checks, tests and the benchmark."""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sidelinja_worker.queue.context import JobContext
from sidelinja_worker.queue.errors import PermanentError, RetryJob
from sidelinja_worker.queue.priorities import default_priority
from sidelinja_worker.queue.registry import JobType


class NoopPayload(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    sleep_ms: int | None = Field(default=None, ge=0, le=3_600_000)
    fail: str | None = None
    fail_permanent: str | None = None


async def run(ctx: JobContext, payload: NoopPayload) -> Any:
    if payload.sleep_ms:
        await asyncio.sleep(payload.sleep_ms / 1000)
    if payload.fail_permanent is not None:
        raise PermanentError(payload.fail_permanent)
    if payload.fail is not None:
        raise RetryJob(payload.fail)
    # model_dump(exclude_unset=True) by the model's pydantic-core serializer, without the Python
    # wrapper that doubled its cost (2.6 -> 1.3 µs): the benchmark's no-op job measures the queue.
    return payload.__pydantic_serializer__.to_python(payload, exclude_unset=True)


JOB_TYPE = JobType(
    name="noop",
    handler=run,
    payload_model=NoopPayload,
    default_priority=default_priority("noop"),
    timeout_s=300,
    description="returns its payload; {sleep_ms}, {fail} and {fail_permanent} for probes",
)
