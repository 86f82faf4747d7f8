"""Job type string -> handler, payload model and defaults. One explicit list; duplicates raise."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

from sidelinja_worker.queue.context import JobContext
from sidelinja_worker.queue.db import UndecodableJson
from sidelinja_worker.queue.errors import PermanentError

Handler = Callable[[JobContext, Any], Awaitable[Any]]


@dataclass(frozen=True)
class JobType:
    """One kind of job. `name` is the stable string stored in `job_queue.job_type`; renaming the
    Python function never strands queued rows."""

    name: str
    handler: Handler
    payload_model: type[BaseModel]
    default_priority: int
    timeout_s: float
    description: str
    needs_settings: tuple[str, ...] = field(default=())

    def parse_payload(self, raw: Any) -> BaseModel:
        """The payload as the handler's model; a bad one is a PermanentError naming the field."""
        if not isinstance(raw, dict):
            if isinstance(raw, UndecodableJson):
                raise PermanentError(f"invalid payload: {raw}")
            raise PermanentError(
                f"invalid payload: expected a JSON object, got {type(raw).__name__}"
            )
        try:
            # The model's own pydantic-core validator: what model_validate calls, without its
            # Python wrapper, which cost 1 of its 2.6 µs a job (profiled).
            return self.payload_model.__pydantic_validator__.validate_python(raw)
        except ValidationError as exc:
            raise PermanentError(f"invalid payload: {describe_validation_error(exc)}") from None


# Listing a ValidationError's errors builds every one of them in one call that holds the GIL,
# and with it the event loop, in a thread too: a model's answer with 200,000 wrong items held it
# 2.1 s. Past this many (a few milliseconds' worth) they are counted, not listed.
MAX_LISTED_VALIDATION_ERRORS = 1000


def describe_validation_error(exc: ValidationError) -> str:
    """`field.sub: message; other: message`, short enough for error_msg and one CLI line; for
    more than MAX_LISTED_VALIDATION_ERRORS errors, only how many there are."""
    count = exc.error_count()
    if count > MAX_LISTED_VALIDATION_ERRORS:
        return f"{count} validation errors for {exc.title}, too many to list"
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err["loc"]) or "(payload)"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


class Registry(Mapping[str, JobType]):
    def __init__(self, job_types: Iterable[JobType]) -> None:
        self._types: dict[str, JobType] = {}
        for jt in job_types:
            if jt.name in self._types:
                raise ValueError(f"job type {jt.name!r} is registered twice")
            self._types[jt.name] = jt

    def __getitem__(self, name: str) -> JobType:
        return self._types[name]

    def get(self, name: str, default: JobType | None = None) -> JobType | None:  # type: ignore[override]
        return self._types.get(name, default)  # Mapping's own get goes through __getitem__

    def __iter__(self) -> Iterator[str]:
        return iter(self._types)

    def __len__(self) -> int:
        return len(self._types)
