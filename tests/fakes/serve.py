"""Runs an aiohttp application on 127.0.0.1 on a free port, in the test's event loop."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web


@asynccontextmanager
async def serve(app: web.Application) -> AsyncIterator[str]:
    """Yields the server's base URL, e.g. http://127.0.0.1:41234; stops it on exit."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()
