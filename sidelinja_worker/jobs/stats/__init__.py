"""Podcast download statistics from Caddy access logs (IAB Podcast Measurement rules).

Pure, synchronous code: it runs in a separate process so the worker's event loop never waits on
it. The handler (`handlers/stats_parse.py`) and `stats_store.py` do the database side."""
