"""`pause` and `resume` as an operator types them: the same words as the other commands."""

from __future__ import annotations

import pytest

from sidelinja_worker.jobs.catalog import REGISTRY
from tests.helpers import cli, one_line_error


@pytest.mark.parametrize("args", [("pause", "nope", "--reason", "x"), ("resume", "nope")])
def test_an_unknown_type_names_the_known_ones_as_enqueue_does(
    db_url: str, args: tuple[str, ...]
) -> None:
    line = one_line_error(cli(*args, url=db_url))
    assert line == (
        f"sidelinja-worker: error: unknown job type 'nope'; known: {', '.join(sorted(REGISTRY))}"
    )
