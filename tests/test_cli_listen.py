"""`admin` and `run --metrics-port` where they cannot listen: one line and exit 2, naming the
flag, nothing announced and nothing blamed on the database."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager

from tests.helpers import cli, one_line_error


@contextmanager
def _taken() -> Iterator[int]:
    """A port another socket listens on."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield int(taken.getsockname()[1])


def test_a_port_in_use_is_one_line_and_exit_2(db_url: str) -> None:
    with _taken() as port:
        bind = f"127.0.0.1:{port}"
        out = cli("admin", "--bind", bind, url=db_url, timeout_s=60)
    assert out.returncode == 2  # 3 is a worker whose internal task died
    assert one_line_error(out) == f"sidelinja-worker: error: --bind {bind}: Address already in use"
    assert "/admin/jobs" not in out.stderr  # nothing said it serves there


def test_a_metrics_port_in_use_is_one_line_naming_the_flag(db_url: str) -> None:
    with _taken() as port:
        out = cli("run", "--burst", "--metrics-port", str(port), url=db_url, timeout_s=60)
    assert out.returncode == 2
    line = one_line_error(out)
    assert line == f"sidelinja-worker: error: --metrics-port {port}: Address already in use"
