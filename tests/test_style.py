"""The code's style is enforced, not suggested: ruff's lint and format as pyproject.toml sets them."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _ruff(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_ruff_lint_passes() -> None:
    done = _ruff("check", "--no-cache", ".")
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_format_is_applied() -> None:
    done = _ruff("format", "--check", "--no-cache", ".")
    assert done.returncode == 0, done.stdout + done.stderr


# The repository stands alone: its code and comments cite neither issue trackers nor documents
# it does not contain. (The docs have the same check in tests/test_docs.py.)
_OUTSIDE = re.compile(r"(?i:\bissues? #?\d+)|\bDESIGN\b|interfaces\.md|\bshared/|jobbk")


def test_code_cites_nothing_outside_the_repository() -> None:
    found = []
    for folder in ("sidelinja_worker", "bench", "tests"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix not in {".py", ".sql", ".html", ".js", ".css", ".md"}:
                continue
            for number, line in enumerate(path.read_text("utf-8").splitlines(), 1):
                if _OUTSIDE.search(line) and path.name not in {"test_style.py", "test_docs.py"}:
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "\n".join(found)
