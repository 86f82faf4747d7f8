"""Country of a listener from a MaxMind-format database (GeoLite2/GeoIP2 Country or City, or
DB-IP's free mmdb), when GEOIP_DB names one. Optional: needs the `maxminddb` package."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from sidelinja_worker.queue.errors import PermanentError


def country_lookup(db_path: str | None) -> Callable[[str], str]:
    """ip key -> ISO country code ('' when unknown). Without GEOIP_DB every country is ''."""
    if not db_path:
        return lambda ip: ""
    try:
        import maxminddb
    except ImportError:
        raise PermanentError(
            "GEOIP_DB is set but the maxminddb package is not installed (pip install maxminddb)"
        ) from None
    if not Path(db_path).is_file():
        raise PermanentError("GEOIP_DB does not name a readable file")
    reader = maxminddb.open_database(db_path)
    cache: dict[str, str] = {}

    def country(ip: str) -> str:
        hit = cache.get(ip)
        if hit is None:
            # An IPv6 key is its /64; the network's first address stands for it. What is no
            # address has no country: the reader raises ValueError for it, which failed the
            # run while its rows were hashed, and every run after it.
            try:
                record = reader.get(ip.removesuffix("/64"))
            except ValueError:
                record = None
            hit = cache[ip] = _iso_code(record)
        return hit

    return country


def _iso_code(record: object) -> str:
    if not isinstance(record, dict):
        return ""
    country = record.get("country") or record.get("registered_country") or {}
    return str(country.get("iso_code", "")) if isinstance(country, dict) else ""
