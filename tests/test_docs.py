"""The README and docs/ stand on their own: every relative link resolves to a file of the
repository (and, with an anchor, to a heading in it), and the README stays a front door."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from sidelinja_worker.cli.main import build_parser

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench" / "RESULTS.md"]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    return {slug(m) for m in re.findall(r"^#+ (.+)$", text, flags=re.M)}


def links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    return LINK.findall(text)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves_inside_the_repository(doc: Path) -> None:
    broken = []
    for target in links(doc):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto: leave the repository
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (doc.parent / file_part).resolve() if file_part else doc
        if not resolved.is_relative_to(ROOT) or not resolved.exists():
            broken.append(f"{target}: no such file in the repository")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading #{anchor} in {resolved.relative_to(ROOT)}")
    assert not broken, f"{doc.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_readme_is_a_front_door() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme) <= 15_000, f"README.md is {len(readme)} characters; depth goes to docs/"
    first = links(ROOT / "README.md")[0]
    assert not first.startswith(".."), first


def _commands(parser: argparse.ArgumentParser, prefix: str = "") -> list[str]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                nested = _commands(sub, f"{prefix}{name} ")
                found += nested or [f"{prefix}{name}"]
    return found


def test_the_readme_lists_every_command() -> None:
    table = (ROOT / "README.md").read_text(encoding="utf-8").split("## Commands", 1)[1]
    table = table.split("\n## ", 1)[0]
    commands = _commands(build_parser())
    assert "workspace list" in commands and "jobs retry" in commands
    missing = []
    for command in commands:
        *group, action = command.split()
        # `jobs show ID` / `jobs cancel ID`, and `admin-token create …` / `list` / `revoke ID`
        shown = f"`sidelinja-worker {command}" in table or f"`{command}" in table
        if not shown and group:
            shown = f"`sidelinja-worker {group[0]} " in table and f"/ `{action}" in table
        if not shown:
            missing.append(command)
    assert not missing, f"README.md's commands table lacks: {', '.join(missing)}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_reference_to_what_the_repository_does_not_hold(doc: Path) -> None:
    text = doc.read_text(encoding="utf-8")
    found = re.findall(r"\bissues? #?\d+|DESIGN\.md|\bDESIGN §|\.\./shared/", text, flags=re.I)
    assert not found, f"{doc.relative_to(ROOT)} cites {found}: the repository must stand alone"
