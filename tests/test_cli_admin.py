"""`sidelinja-worker admin` where it cannot listen: one line and exit 2, nothing announced."""

from __future__ import annotations

import socket

from tests.helpers import cli, one_line_error


def test_a_port_in_use_is_one_line_and_exit_2(db_url: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        bind = f"127.0.0.1:{taken.getsockname()[1]}"
        out = cli("admin", "--bind", bind, url=db_url, timeout_s=60)
    assert out.returncode == 2  # 3 is a worker whose internal task died
    assert one_line_error(out) == f"sidelinja-worker: error: --bind {bind}: Address already in use"
    assert "/admin/jobs" not in out.stderr  # nothing said it serves there
