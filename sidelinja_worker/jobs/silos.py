"""What a workspace's jobs may reach beyond its own rows: Forgejo repositories, AI models and
how many paid AI calls one job may make. Files are confined by `media_paths`.

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

from collections.abc import Iterable, Mapping
from typing import Any

from sidelinja_worker.queue.context import JobContext
from sidelinja_worker.queue.errors import PermanentError
from sidelinja_worker.services.ai_gateway import AiGateway, CallGuard, GuardError

DEFAULT_MAX_PAID_CALLS = 200
MAX_PAID_CALLS_CEILING = 100_000
REPOS_RULE = "workspace setting forgejo.repos"
CALLS_RULE = "workspace setting ai.max_paid_calls_per_job"


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
    guard = call_guard(await ctx.workspace_settings(), defaults)
    return AiGateway.from_services(ctx.services, guard)


def check_planned_calls(guard: CallGuard | None, planned: int, what: str) -> None:
    """Fails before the first call when the job's plan already needs more calls than allowed."""
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
