"""What a workspace's jobs may reach beyond its own rows: its own files, Forgejo repositories,
AI models and how many paid AI calls one job may make. `media_paths` checks a payload's path
names a file in the workspace's media folder; `open_in_folder` opens it as the file that was
checked: no symlink swapped in since, no hard link, nothing but a regular file.

Workspace settings read (`workspaces.settings`):
    forgejo.repos                ["owner/repo", "owner/*", ...] the repositories its jobs may
                                 read and write. Default: none; the worker's Forgejo token
                                 reaches every workspace's repositories, so each workspace
                                 names its own.
    ai.models                    ["vendor/model", ...] the models its jobs may call. Default:
                                 the models its own settings name (ai.model, ai.<job type>.model,
                                 ai.embeddings.model, ai.prompt_eval.judge_model) and the
                                 built-in defaults of the job types; a payload cannot add one.
    ai.max_paid_calls_per_job    how many AI gateway calls one job may make (prompt_eval's cases
                                 x models and judge calls, the map-reduce's parts and combine
                                 calls, embeddings batches). Default DEFAULT_MAX_PAID_CALLS.
A job past any of these fails permanently naming the setting; nothing is called first."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO
from uuid import UUID

from sidelinja_worker.jobs.media_paths import resolve_media_path, workspace_media_root
from sidelinja_worker.queue.errors import PermanentError

if TYPE_CHECKING:
    from sidelinja_worker.queue.context import JobContext
    from sidelinja_worker.services.ai_gateway import AiGateway, CallGuard

# The AI gateway's client (httpx, pydantic: 0.3 s and 21 MB) is imported by the functions that
# use it: the stats parse's child process imports this module for `open_in_folder` alone.

DEFAULT_MAX_PAID_CALLS = 200
MAX_PAID_CALLS_CEILING = 100_000
REPOS_RULE = "workspace setting forgejo.repos"
CALLS_RULE = "workspace setting ai.max_paid_calls_per_job"
# Each step of a path is opened relative to the folder before it and never through a symlink,
# so what is opened is the path that was checked, whatever was swapped in since.
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# Non-blocking: a named pipe swapped in opens at once (and is refused) rather than waiting for
# a writer in a thread nothing can stop.
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class UnsafeFile(OSError):
    """A file a job may not read: not a regular file, hard-linked, or out of its folder by a
    symlink swapped in after the path was checked."""


def open_in_folder(folder: Path, path: Path) -> BinaryIO:
    """`path` opened for reading, refused unless it is a regular file under `folder` (a
    resolved folder) with one link. The path is resolved, then each step of the resolved path
    is opened from `folder` without following a symlink: a swap between the check and the open
    makes the open fail. A second link may be another workspace's file (it is the same file
    under another name), so a hard-linked file is refused. Blocking file system calls: run it
    in a thread."""
    try:
        target = path.resolve(strict=True)
    except RuntimeError as exc:  # a symlink loop (Python 3.11)
        raise UnsafeFile(f"cannot be resolved: {exc}") from None
    if not target.is_relative_to(folder) or target == folder:
        raise UnsafeFile("leads out of its folder: refused")
    *steps, name = target.relative_to(folder).parts
    fd = _open_steps(folder, steps)
    try:
        file_fd = os.open(name, _FILE_FLAGS, dir_fd=fd)
    except OSError as exc:
        raise _swapped(exc) from None
    finally:
        os.close(fd)
    try:
        _check_regular(os.fstat(file_fd))
        os.set_blocking(file_fd, True)
    except BaseException:
        os.close(file_fd)
        raise
    # Named by the path it was asked for, as `open` names a file (readers like mutagen use it).
    return open(path, "rb", opener=lambda _name, _flags: file_fd)


def _open_steps(folder: Path, steps: list[str]) -> int:
    """A descriptor of the folder `steps` lead to from `folder`, no symlink followed."""
    try:
        fd = os.open(folder, _DIR_FLAGS)  # the folder itself swapped for a symlink: refused
    except OSError as exc:
        raise _swapped(exc) from None
    for step in steps:
        try:
            next_fd = os.open(step, _DIR_FLAGS, dir_fd=fd)
        except OSError as exc:
            os.close(fd)
            raise _swapped(exc) from None
        os.close(fd)
        fd = next_fd
    return fd


def _swapped(exc: OSError) -> OSError:
    """A symlink or a file where the checked path had a folder or a file (ELOOP, ENOTDIR) is a
    swap; anything else stays what it is (a missing step: removed or rotated since)."""
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return UnsafeFile(f"changed while it was opened ({exc.strerror}): refused")
    return exc


def _check_regular(info: os.stat_result) -> None:
    if not stat.S_ISREG(info.st_mode):
        raise UnsafeFile("is not a regular file: refused")
    if info.st_nlink != 1:
        raise UnsafeFile(
            f"has {info.st_nlink} links: a hard link may be another workspace's file, refused"
        )


def open_media_file(media_root: str, workspace_id: UUID, path: str) -> BinaryIO:
    """The payload's `path` in the workspace's media folder (`resolve_media_path`), opened by
    `open_in_folder`. Every refusal is permanent. Blocking: run it in a thread."""
    target = resolve_media_path(media_root, workspace_id, path)
    folder = workspace_media_root(media_root, workspace_id)
    try:
        return open_in_folder(folder, target)
    except FileNotFoundError:
        raise PermanentError(
            f"file {path!r} not found in this workspace's media folder (MEDIA_ROOT/{workspace_id})"
        ) from None
    except UnsafeFile as exc:
        raise PermanentError(f"file {path!r} {exc}") from None


def check_repo(settings: Mapping[str, Any], owner: str, repo: str) -> None:
    """Refuses a repository the workspace's `forgejo.repos` does not list (permanent)."""
    allowed = _string_list(_section(settings, "forgejo").get("repos"), "forgejo.repos")
    wanted = f"{owner}/{repo}".lower()
    for entry in allowed or ():
        o, _, r = entry.lower().partition("/")
        if (o, r) == (owner.lower(), repo.lower()) or (o == owner.lower() and r == "*"):
            return
    listed = "none set" if not allowed else f"{len(allowed)} listed"
    raise PermanentError(
        f"Forgejo repository {wanted!r} is not allowed in this workspace ({REPOS_RULE}: {listed})"
    )


def call_guard(settings: Mapping[str, Any], defaults: Iterable[str]) -> CallGuard:
    """The guard for one job's gateway calls, from the workspace's settings."""
    from sidelinja_worker.services.ai_gateway import CallGuard

    ai = _section(settings, "ai")
    listed = _string_list(ai.get("models"), "ai.models")
    if listed is not None:
        models, rule = frozenset(listed), "workspace setting ai.models"
    else:
        models = frozenset(_named_models(ai)) | frozenset(defaults)
        rule = (
            "workspace setting ai.models unset: only the models its settings name and the defaults"
        )
    limit = ai.get("max_paid_calls_per_job", DEFAULT_MAX_PAID_CALLS)
    if type(limit) is not int or not 1 <= limit <= MAX_PAID_CALLS_CEILING:
        raise PermanentError(
            f"workspace settings ai.max_paid_calls_per_job: expected a whole number from 1 to "
            f"{MAX_PAID_CALLS_CEILING}, got {limit!r}"
        )
    return CallGuard(models, limit, rule, CALLS_RULE)


async def guarded_gateway(ctx: JobContext, defaults: Iterable[str]) -> AiGateway:
    """The AI gateway for this job, refusing models and calls past the workspace's limits."""
    from sidelinja_worker.services.ai_gateway import AiGateway

    guard = call_guard(await ctx.workspace_settings(), defaults)
    return AiGateway.from_services(ctx.services, guard)


def check_planned_calls(guard: CallGuard | None, planned: int, what: str) -> None:
    """Fails before the first call when the job's plan already needs more calls than allowed."""
    from sidelinja_worker.services.ai_gateway import GuardError

    if guard is not None and planned > guard.max_calls:
        raise GuardError(
            f"{what} needs {planned} paid AI calls, over this job's limit of {guard.max_calls} "
            f"({guard.calls_rule})"
        )


def _named_models(ai: Mapping[str, Any]) -> list[str]:
    named = [ai.get("model")]
    for value in ai.values():
        if isinstance(value, Mapping):
            named += [value.get("model"), value.get("judge_model")]
    return [m for m in named if isinstance(m, str) and m]


def _section(settings: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = settings.get(key) or {}
    if not isinstance(value, Mapping):
        raise PermanentError(f"workspace settings {key}: expected an object")
    return value


def _string_list(value: Any, where: str) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise PermanentError(f"workspace settings {where}: expected a list of names")
    return value
