"""User agents: bots and Apple Watch duplicates out, everything else named by its app family.

The rules are a vendored, ordered list in the format of opawg/user-agents-v2 (data/), plus the
fallbacks OP3 applies to agents the list does not know (no agent; `bot`, `crawler`, `spider`)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from importlib import resources

UNKNOWN = "Other"
_BOTLIKE = re.compile(r"bot|crawler|spider", re.IGNORECASE)
# Bounds the per-agent cache; a log has few distinct agents, a hostile one can have many.
_CACHE_MAX = 50_000


@dataclass(frozen=True)
class AgentRule:
    pattern: re.Pattern[str]
    name: str
    is_bot: bool


def load_rules() -> list[AgentRule]:
    raw = (
        resources.files("sidelinja_worker.jobs.stats")
        .joinpath("data/user-agents.json")
        .read_text("utf-8")
    )
    return [
        AgentRule(
            re.compile(e["pattern"]), e["name"], e["type"] == "bot" or e.get("category") == "bot"
        )
        for e in json.loads(raw)["entries"]
    ]


class AgentClassifier:
    """`family(ua)`: the app family, or None when the request is not a listener's."""

    def __init__(self, rules: list[AgentRule] | None = None) -> None:
        self._rules = load_rules() if rules is None else rules
        self._cache: dict[str, str | None] = {}

    def family(self, user_agent: str) -> str | None:
        hit = self._cache.get(user_agent, "")
        if hit != "":
            return hit
        if len(self._cache) >= _CACHE_MAX:
            self._cache.clear()
        result = self._classify(user_agent)
        self._cache[user_agent] = result
        return result

    def _classify(self, user_agent: str) -> str | None:
        if not user_agent.strip():
            return None  # OP3: no User-Agent is a bot
        for rule in self._rules:
            if rule.pattern.search(user_agent):
                return None if rule.is_bot else rule.name
        return None if _BOTLIKE.search(user_agent) else UNKNOWN
