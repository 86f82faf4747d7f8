"""One thin client per outside service, each on the process's shared httpx.AsyncClient."""
