"""`admin-token list` as an operator reads it: something said when empty, labels in a column."""

from __future__ import annotations

from uuid import UUID

from tests.helpers import cli


def test_an_empty_list_says_how_to_make_a_token(db_url: str) -> None:
    out = cli("admin-token", "list", url=db_url)
    assert out.returncode == 0, out.stderr
    assert out.stdout == ""
    assert "no tokens yet: `sidelinja-worker admin-token create --all`" in out.stderr


def test_labels_line_up_whatever_the_scope(db_url: str, workspace: UUID) -> None:
    ws = str(workspace)
    assert cli("admin-token", "create", "--all", "--label", "ops", url=db_url).returncode == 0
    made = cli("admin-token", "create", "--workspace", ws, "--label", "editor", url=db_url)
    assert made.returncode == 0, made.stderr
    lines = cli("admin-token", "list", url=db_url).stdout.splitlines()
    assert len(lines) == 2 and all(line == line.rstrip() for line in lines)
    label_at = {line.rindex(" ") + 1 for line in lines}  # each label is one word here
    assert len(label_at) == 1, lines
