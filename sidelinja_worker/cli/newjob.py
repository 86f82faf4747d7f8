"""What `enqueue` accepts, checked one way: the flags of one job and the lines of a bulk file
both become a client.NewJob here, or a UserError naming what is wrong."""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from pydantic import TypeAdapter, ValidationError

from sidelinja_worker.cli.session import parse_uuid
from sidelinja_worker.jobs.catalog import REGISTRY
from sidelinja_worker.queue import client
from sidelinja_worker.queue.client import SMALLINT_MAX
from sidelinja_worker.queue.db import say
from sidelinja_worker.queue.durations import parse_duration_s
from sidelinja_worker.queue.errors import UserError

DEFAULT_MAX_ATTEMPTS = 3
UNIQUE_KEY_MAX = 1000  # characters of a unique key, on the command line as in a bulk file
INT32_MAX = 2**31 - 1  # timeout_s is an INTEGER column
# jsonb's encoder writes whole numbers of at most 64 bits; a bigger one failed with a traceback.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# A delay past this is a typo; a far bigger one overflows PostgreSQL's timestamps.
MAX_DELAY_DAYS = 36_500
# The same JSON parser as the bulk file's lines: it refuses nesting past its recursion limit,
# lone surrogates and numbers of thousands of digits with a ValidationError, where json.loads
# raised RecursionError or ValueError past the error handling.
_JSON: TypeAdapter[Any] = TypeAdapter(Any)


def from_flags(args: argparse.Namespace) -> client.NewJob:
    """The enqueue arguments as a NewJob, or a UserError naming the first bad one."""
    if args.job_type is None or args.workspace is None:
        raise UserError("give JOB_TYPE and --workspace (or --file with one job per line)")
    try:
        payload = _JSON.validate_json(args.payload or "{}")
    except ValidationError as exc:
        raise UserError(f"--payload is not JSON: {exc.errors()[0]['msg']}") from None
    if not isinstance(payload, dict):
        raise UserError(f"--payload must be a JSON object, got {type(payload).__name__}")
    workspace = parse_uuid(args.workspace, "--workspace")
    max_attempts = DEFAULT_MAX_ATTEMPTS if args.max_attempts is None else args.max_attempts
    if not 1 <= max_attempts <= SMALLINT_MAX:
        raise UserError(f"--max-attempts must be 1 to {SMALLINT_MAX}, not {max_attempts}")
    if args.priority is not None and not -SMALLINT_MAX <= args.priority <= SMALLINT_MAX:
        raise UserError(f"--priority must be -{SMALLINT_MAX} to {SMALLINT_MAX}")
    timeout_s = None
    if args.timeout:
        timeout_s = math.ceil(_duration("--timeout", args.timeout))
        if timeout_s < 1:
            raise UserError(f"--timeout must be at least 1s, not {args.timeout!r}")
        if timeout_s > INT32_MAX:
            raise UserError(f"--timeout must be 1 to {INT32_MAX} seconds, not {args.timeout!r}")
    if args.unique_key is not None and not 1 <= len(args.unique_key) <= UNIQUE_KEY_MAX:
        raise UserError(f"--unique-key: 1 to {UNIQUE_KEY_MAX:,} characters")
    delay_s = _duration("--in", args.delay) if args.delay else None
    if delay_s is not None and not delay_s <= MAX_DELAY_DAYS * 86400:
        raise UserError(f"--in: at most {MAX_DELAY_DAYS}d, not {args.delay!r}")
    return new_job(
        workspace,
        args.job_type,
        payload,
        priority=args.priority,
        scheduled_for=parse_timestamp(args.at, "--at") if args.at else None,
        delay_s=delay_s,
        max_attempts=max_attempts,
        unique_key=args.unique_key,
        timeout_s=timeout_s,
    )


def new_job(
    workspace: UUID, job_type: str, payload: Mapping[str, Any], **options: Any
) -> client.NewJob:
    """A checked NewJob of a known job type; `options` are NewJob's optional fields."""
    if job_type not in REGISTRY:
        raise unknown_type(job_type)
    check_storable(payload, "payload")
    try:
        return client.NewJob(workspace, job_type, payload, **options).checked()
    except ValueError as exc:
        raise UserError(str(exc)) from None


def unknown_type(job_type: str) -> UserError:
    """The one error every command gives for a job type no worker runs."""
    return UserError(f"unknown job type {job_type!r}; known: {', '.join(sorted(REGISTRY))}")


def check_storable(value: Any, where: str) -> None:
    """A UserError naming the first value in `value` that jsonb cannot hold as given: a NUL
    character (PostgreSQL refuses it), a whole number past 64 bits (the encoder refuses it),
    NaN or an infinity (stored as null: the job would see another payload than was given).
    The parsers bound the nesting, so the recursion is shallow."""
    if isinstance(value, str):
        if "\x00" in value:
            raise UserError(f"{where}: a NUL character, which PostgreSQL cannot store")
    elif isinstance(value, bool):
        return
    elif isinstance(value, int):
        if not INT64_MIN <= value <= INT64_MAX:
            raise UserError(f"{where}: a whole number past 64 bits")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise UserError(f"{where}: not a finite number (NaN or an infinity)")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if "\x00" in key:
                raise UserError(f"{where}: a NUL character in a key")
            check_storable(item, f"{where}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            check_storable(item, f"{where}.{i}")


def _duration(flag: str, text: str) -> float:
    try:
        return parse_duration_s(text)
    except UserError as exc:
        raise UserError(f"{flag}: {exc}") from None


def parse_timestamp(text: str, what: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise UserError(
            f"{what} {text!r} is not an ISO 8601 timestamp, e.g. 2026-12-24T18:00"
        ) from None
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    try:  # 0001-01-01T00:00+14:00 is a time before year 1 in UTC, which no datetime holds
        return value.astimezone(UTC)
    except OverflowError:
        raise UserError(f"{what} {text!r} is out of range") from None


def warn_missing_settings(args: argparse.Namespace, job_types: Iterable[str]) -> None:
    """One warning per job type that needs a setting this machine lacks."""
    config = args.settings.service_config()
    for job_type in sorted(job_types):
        missing = config.missing(REGISTRY[job_type].needs_settings)
        if missing:
            say(
                f"sidelinja-worker: warning: {job_type} needs {', '.join(missing)}, not set "
                "here; a worker without them fails the job at once"
            )
