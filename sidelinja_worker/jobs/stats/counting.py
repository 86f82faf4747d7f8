"""Step 1 and the raw material of steps 2-3 of the IAB process: which log entries are episode
downloads by a listener, and the bytes each listener (IP + User-Agent) received per episode and
UTC day. Deciding which listeners reached the threshold happens later, against the database,
because a listener's ranges can span several runs."""

from __future__ import annotations

import ipaddress
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec

from sidelinja_worker.jobs.stats.agents import AgentClassifier
from sidelinja_worker.jobs.stats.records import (
    FULL_DECODER,
    Entry,
    EntryDecoder,
    FullRequest,
    HostRequest,
    Request,
    decoder_for,
    response_headers,
)
from sidelinja_worker.jobs.stats.spill import MAX_LISTENER_BYTES, Record, write_records

DAY_S = 86400
AUDIO_EXTENSIONS = (".mp3", ".m4a", ".aac", ".ogg", ".opus", ".mp4", ".m4b", ".flac", ".wav")
_CACHE_MAX = 100_000
# The most bytes one response may have sent (64 GiB: no episode is near it); a line that says
# more, or less than none, is not an entry. Summed, such sizes went past PostgreSQL's BIGINT.
MAX_RESPONSE_BYTES = 1 << 36
# Digits of a count in a header: 18 keep it inside BIGINT.
_MAX_DIGITS = 18
# Episodes one parse keeps: far more than a podcast network publishes. Listeners spill to files
# but an episode's size, path and threshold stay in memory (and each is looked up on disk and
# stored): a site whose catch-all answers 200 to any path lets any client make a new episode
# with each request. Past it, requests for other paths are not counted.
MAX_EPISODES = 20_000
# The longest field values kept. Lines run up to logfiles.MAX_LINE_BYTES (1 MiB), and every
# value a parse keeps (a cache key, a listener's address or agent, an episode) was kept whole:
# 1,500 lines of a 1 MiB client_ip each held 1.5 GB in the parse, pickled whole to the worker.
# An address is at most 45 characters (IPv6 with an IPv4 tail), 64 with a zone: a longer one
# is a bad line. A User-Agent is cut (listeners are told apart within its first KiB), a path
# past MAX_PATH_CHARS is no episode, and longer URIs, ranges and hosts are judged but not
# cached.
MAX_IP_CHARS = 64
MAX_AGENT_CHARS = 1024
MAX_PATH_CHARS = 1024
_MAX_CACHED_URI = 256
_MAX_RANGE_CHARS = 64  # 'bytes=' and two 18-digit numbers fit; a probe is shorter
_MAX_HOST_CHARS = 300  # a DNS name (253) with a port
# The agents' text one parse holds before it spills its listeners (with their agents) to a
# run file: many distinct long agents would otherwise fill memory below `spill_at` listeners.
SPILL_AGENT_BYTES = 16 << 20

# (UTC day as days since 1970-01-01, episode, IP key, User-Agent)
ListenerKey = tuple[int, str, str, str]


def host_name(host: str) -> str:
    """A Host header (or a configured host) without its port, brackets or case:
    `Pod.example.no:443` -> `pod.example.no`, `[2001:db8::1]:8443` -> `2001:db8::1`."""
    host = host.strip().lower()
    if host.startswith("["):  # an IPv6 literal, with or without a port
        return host[1 : host.index("]")] if "]" in host else host[1:]
    if host.count(":") == 1:  # name:port (a bare IPv6 address has more colons)
        return host.partition(":")[0]
    return host


@dataclass(frozen=True)
class EpisodeRules:
    """Which request paths are episodes (from the workspace's `stats` settings)."""

    url_prefix: str = "/"
    extensions: tuple[str, ...] = AUDIO_EXTENSIONS
    episodes: dict[str, str] | None = None  # path -> episode id; when set, only these count
    hosts: tuple[str, ...] = ()

    def episode(self, path: str) -> str | None:
        if "\x00" in path:  # no file's path holds one, and PostgreSQL stores none in text
            return None
        if self.episodes is not None:
            return self.episodes.get(path)
        if path.startswith(self.url_prefix) and path.lower().endswith(self.extensions):
            return path
        return None


class Listen(msgspec.Struct, gc=False):
    """What one listener received of one episode in one UTC day. A Struct: built in C, so
    the worker unpickling a big result (parse.py) spends little on it."""

    bytes: int = 0
    whole: bool = False  # a 200 that delivered its whole Content-Length


@dataclass
class Tally:
    """Running totals of one parse. Memory grows with distinct listeners, not with lines."""

    rules: EpisodeRules
    agents: AgentClassifier = field(default_factory=AgentClassifier)
    families: dict[str, str] = field(default_factory=dict)  # User-Agent -> app family
    sizes: dict[str, int] = field(default_factory=dict)  # episode -> file size seen in headers
    paths: dict[str, str] = field(default_factory=dict)  # episode -> its request path
    lines: int = 0  # non-blank lines read, bad ones included
    bad_lines: int = 0
    counted_requests: int = 0
    # Per-distinct-value caches of the hot loop. Their values are also the objects the listener
    # keys hold, so a key shares its strings and day with every other key (memory).
    _uris: dict[str, str | None] = field(default_factory=dict)  # URI -> episode or None
    _agents: dict[str, str | None] = field(default_factory=dict)  # UA -> itself, None if a bot
    _ips: dict[str, str] = field(default_factory=dict)  # address -> listener part
    _probes: dict[str, bool] = field(default_factory=dict)
    _hosts: dict[str, bool] = field(default_factory=dict)
    _days: dict[int, int] = field(default_factory=dict)
    # Per listener plain ints and a set, not an object each: less memory and a faster loop.
    _bytes: dict[ListenerKey, int] = field(default_factory=dict)
    _whole: set[ListenerKey] = field(default_factory=set)
    _decoder: EntryDecoder = field(init=False, repr=False, compare=False)
    # Past `spill_at` listeners in memory, they go to a sorted run file in `spill_dir` and
    # memory starts again: bounded by the threshold, not by the log (spill.py).
    spill_at: int | None = None
    spill_dir: Path | None = None
    runs: list[Path] = field(default_factory=list)
    spilled_days: set[int] = field(default_factory=set)
    spilled_episodes: set[str] = field(default_factory=set)
    refused_episodes: int = 0  # paths past MAX_EPISODES, each counted once per cache fill
    agent_bytes: int = 0  # of the agents in `families`, forgotten at each spill
    _agent_cache_bytes: int = 0  # of the agents in `_agents`
    # The last UTC day a download can have: tomorrow, for clocks a little ahead.
    last_day: int = field(default_factory=lambda: int(time.time() // DAY_S) + 1)

    def __post_init__(self) -> None:
        self._decoder = decoder_for(bool(self.rules.hosts))

    @property
    def listens(self) -> dict[ListenerKey, Listen]:
        """Each listener's bytes of an episode in a UTC day, and whether a 200 was whole."""
        whole = self._whole
        return {key: Listen(sent, key in whole) for key, sent in self._bytes.items()}

    def add_block(self, block: bytes | memoryview) -> None:
        """Counts a block of whole lines, decoded in one call. A block with a line that is not
        an entry is decoded again line by line, so only that line is lost."""
        # Every line is decoded: a byte-level pre-filter on the URI measured slower than
        # msgspec's typed decode once more than ~30% of lines are episodes (a media host's log).
        try:
            entries = self._decoder.decode_lines(block)
        except msgspec.DecodeError:
            self.add_lines(bytes(block).split(b"\n"))
            return
        self.lines += len(entries)
        stop = self.add_entries(entries)
        if stop is not None:
            self._decoder = FULL_DECODER
            self.add_entries(FULL_DECODER.decode_lines(block)[stop:])
        self._spill_if_full()

    def add_lines(self, lines: list[bytes]) -> None:
        good: list[bytes] = []
        entries: list[Entry] = []
        for line in lines:
            try:
                entries.append(self._decoder.decode(line))
                good.append(line)
            except msgspec.DecodeError:
                if line.strip():  # blank lines are skipped, as in add_block
                    self.bad_lines += 1
                    self.lines += 1
        self.lines += len(entries)
        stop = self.add_entries(entries)
        if stop is not None:
            self._decoder = FULL_DECODER
            self.add_entries([FULL_DECODER.decode(line) for line in good[stop:]])
        self._spill_if_full()

    def _spill_if_full(self) -> None:
        if self.spill_at is not None and (
            len(self._bytes) >= self.spill_at or self.agent_bytes >= SPILL_AGENT_BYTES
        ):
            self.spill()

    def records(self) -> list[Record]:
        """The listeners in memory as spill records, in key order."""
        whole, families = self._whole, self.families
        return [
            (
                key[0],
                key[1],
                key[2],
                key[3],
                families.get(key[3], ""),
                min(sent, MAX_LISTENER_BYTES),
                key in whole,
            )
            for key, sent in sorted(self._bytes.items())
        ]

    def spill(self) -> None:
        """Writes the listeners in memory to a new sorted run and forgets them (and the agent
        cache, so that an agent seen again records its family again)."""
        if not self._bytes:
            return
        assert self.spill_dir is not None, "spill_at needs a spill_dir"
        path = self.spill_dir / f"run-{len(self.runs):05d}"
        write_records(path, self.records())
        self.runs.append(path)
        self.spilled_days.update(key[0] for key in self._bytes)
        self.spilled_episodes.update(key[1] for key in self._bytes)
        self._bytes.clear()
        self._whole.clear()
        self.families.clear()
        self._agents.clear()
        self.agent_bytes = self._agent_cache_bytes = 0

    def add_entries(self, entries: Sequence[Entry]) -> int | None:
        """Counts each entry's bytes towards its listener, or drops it by the IAB rules. The hot
        loop, once per log line: one function, with every repeated look-up a dict hit on a
        local (a method call per line costs as much as the rest of the loop).

        Stops at a counted entry without `client_ip` that was decoded without `remote_ip`, and
        returns its index: the caller decodes the rest again with FULL_DECODER."""
        listens, sizes, uris, agents, ips, probes = (
            self._bytes,
            self.sizes,
            self._uris,
            self._agents,
            self._ips,
            self._probes,
        )
        check_host = bool(self.rules.hosts)
        day, day_start, day_end = -1, 0.0, 0.0
        counted = 0
        for entry in entries:
            status = entry.status
            if status != 206 and status != 200:
                continue  # 304 and errors deliver no episode
            req = entry.request
            if req.method != "GET" or (check_host and not self._host_allowed(req)):
                continue  # HEAD and other methods
            uri = req.uri
            episode = uris.get(uri, "")
            if episode == "":
                episode = self._episode(uri)
            if episode is None:
                continue
            headers = req.headers
            ranges = headers.range
            if ranges:
                probe = probes.get(ranges[0])
                if self._is_probe(ranges[0]) if probe is None else probe:
                    continue
            user_agents = headers.user_agent
            user_agent = user_agents[0] if user_agents else ""
            agent = agents.get(user_agent, "")
            if agent == "":
                agent = self._agent(user_agent)
            if agent is None:
                continue  # a bot, or an Apple Watch duplicate
            ts = entry.ts
            if type(ts) is not float or not day_start <= ts < day_end:
                day, day_start, day_end = self._day(ts)
                if day < 0:  # no time a download can have: the line is not an entry
                    self.bad_lines += 1
                    continue
            size = entry.size
            if not 0 <= size <= MAX_RESPONSE_BYTES:
                self.bad_lines += 1
                continue
            ip = req.client_ip
            if not ip:
                if type(req) is not FullRequest:
                    self.counted_requests += counted
                    return _index(entries, entry)
                ip = req.remote_ip
            listener = ips.get(ip)
            if listener is None:
                listener = self._ip_key(ip)
            if not listener:  # no address ('unknown', a port appended): no listener
                self.bad_lines += 1
                continue
            counted += 1
            key = (day, episode, listener, agent)
            listens[key] = listens.get(key, 0) + size
            if status == 200 or episode not in sizes:
                self._note_size(entry, episode, key)
        self.counted_requests += counted
        return None

    def _host_allowed(self, req: Request) -> bool:
        # A hosts filter decodes with HostRequest or FullRequest (`decoder_for`).
        host = req.host if isinstance(req, HostRequest) else ""
        if len(host) > _MAX_HOST_CHARS:  # no host name: not one of ours, and not cached
            return False
        hit = self._hosts.get(host)
        if hit is None:
            _bound(self._hosts)
            name = host_name(host)
            hit = self._hosts[host] = any(host_name(h) == name for h in self.rules.hosts)
        return hit

    def _episode(self, uri: str) -> str | None:
        path = uri.partition("?")[0]
        episode = self.rules.episode(path) if len(path) <= MAX_PATH_CHARS else None
        if episode is not None and episode not in self.paths:
            if len(self.paths) >= MAX_EPISODES:
                self.refused_episodes += 1
                episode = None
            else:
                self.paths[episode] = path
        if len(uri) <= _MAX_CACHED_URI:  # a long query string is judged each time
            _bound(self._uris)
            self._uris[uri] = episode
        return episode

    def _agent(self, user_agent: str) -> str | None:
        """The User-Agent string to key listeners by (the first copy of it, of at most
        MAX_AGENT_CHARS), None for a bot. A longer one is judged by its first MAX_AGENT_CHARS,
        and only they are cached: the key of every listener of that agent is that one copy."""
        if len(user_agent) > MAX_AGENT_CHARS:
            user_agent = user_agent[:MAX_AGENT_CHARS]
            agent = self._agents.get(user_agent, "")
            if agent != "":
                return agent
        family = self.agents.family(user_agent)
        if len(self._agents) >= _CACHE_MAX or self._agent_cache_bytes >= SPILL_AGENT_BYTES:
            self._agents.clear()  # bots' agents too: the cache is bounded in bytes as well
            self._agent_cache_bytes = 0
        self._agent_cache_bytes += len(user_agent)
        if family is None:
            self._agents[user_agent] = None
            return None
        if user_agent not in self.families:
            self.families[user_agent] = family
            self.agent_bytes += len(user_agent)
        self._agents[user_agent] = user_agent
        return user_agent

    def _is_probe(self, spec: str) -> bool:
        if len(spec) > _MAX_RANGE_CHARS:  # no probe, and not cached
            return False
        _bound(self._probes)
        hit = self._probes[spec] = is_probe(spec)
        return hit

    def _ip_key(self, ip: str) -> str:
        if len(ip) > MAX_IP_CHARS:  # no address, and not cached
            return ""
        _bound(self._ips)
        hit = self._ips[ip] = ip_key(ip)
        return hit

    def _day(self, ts: float | str) -> tuple[int, float, float]:
        """The UTC day of `ts` (days since 1970-01-01) and, for a float, the span of seconds
        it covers: the next lines mostly fall in it and skip the division. -1 for a time that
        is none (another `time_format`, a string that is no ISO time) or that no download can
        have (before 1970, after `last_day`): out of a date's range it failed every run, and a
        day ahead would keep its rows past every pruning."""
        try:
            day = _day(ts)
        except (ValueError, OverflowError):  # not ISO 8601; an infinite float
            return -1, 0.0, 0.0
        if not 0 <= day <= self.last_day:
            return -1, 0.0, 0.0
        day = self._days.setdefault(day, day)  # one int object per day for all the keys
        if type(ts) is not float:
            return day, 0.0, 0.0
        return day, float(day * DAY_S), float((day + 1) * DAY_S)

    def _note_size(self, entry: Entry, episode: str, key: ListenerKey) -> None:
        """The file's size, from the response headers: 206 `Content-Range: bytes a-b/total`,
        200 `Content-Length`. The threshold falls back to it when the media file is absent."""
        resp = response_headers(entry)
        if entry.status == 206 and resp.content_range:
            total = count(resp.content_range[0].rpartition("/")[2])
            if total is not None:
                self.sizes[episode] = total
        elif entry.status == 200:
            length = count(resp.content_length[0]) if resp.content_length else None
            if length is not None:
                self.sizes[episode] = length
                if entry.size >= length > 0:
                    self._whole.add(key)
            elif entry.size > 0:
                self._whole.add(key)


def _index(entries: Sequence[Entry], entry: Entry) -> int:
    """Where `entry` itself is in `entries` (not an equal one: a log repeats lines)."""
    return next(i for i, e in enumerate(entries) if e is entry)


def _bound(cache: dict[Any, Any]) -> None:
    """Empties a cache at its cap: a log has few distinct values, a hostile one can have many."""
    if len(cache) >= _CACHE_MAX:
        cache.clear()


def count(text: str) -> int | None:
    """`text` as a whole number of at most 18 ASCII digits, else None. `str.isdigit` is true
    for '²', which int() refuses, and int() refuses more than 4,300 digits: a header of either
    raised in the parse, which failed every run of the log."""
    if 0 < len(text) <= _MAX_DIGITS and text.isascii() and text.isdigit():
        return int(text)
    return None


def is_probe(spec: str) -> bool:
    """`Range: bytes=0-1` and other requests for at most 2 bytes: players probing the file."""
    if spec == "bytes=0-1":
        return True
    first, _, last = spec.removeprefix("bytes=").partition("-")
    start, end = count(first), count(last)
    if "," in spec or start is None or end is None:
        return False
    return end - start + 1 <= 2


def _day(ts: float | str) -> int:
    if isinstance(ts, str):  # `time_format iso8601` and friends
        return int(datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp() // DAY_S)
    return int(ts // DAY_S)


def ip_key(ip: str) -> str:
    """The unique-listener part of an address: IPv4 whole, IPv6 cut to its /64 (IAB v2.1);
    '' for what is no address ('unknown' from a proxy, '198.51.100.1:443', ''): it names no
    listener, and the country lookup refuses it (which failed every run of the log)."""
    if ":" not in ip:
        return ip if _is_address(socket.AF_INET, ip) else ""
    head = ip.split("::", 1)[0].split(":")
    if len(head) >= 4 and "." not in ip and "%" not in ip:
        # The first four groups are written out: checked by inet_pton (in C), no need for
        # the (slow) full parse.
        if not _is_address(socket.AF_INET6, ip):
            return ""
        return ":".join(h.zfill(4) for h in head[:4]).lower() + "::/64"
    try:
        addr = ipaddress.IPv6Address(ip.split("%", 1)[0])
    except ValueError:
        return ""
    if addr.ipv4_mapped is not None:
        return str(addr.ipv4_mapped)
    return addr.exploded[:19] + "::/64"


def _is_address(family: int, ip: str) -> bool:
    """Whether `ip` is an address of `family` as written: inet_pton takes no port, no
    leading zeros and no spaces, at ~0.5 us against ipaddress's ~7 us."""
    try:
        socket.inet_pton(family, ip)
    except (OSError, ValueError):  # ValueError: a NUL in it, or a character not ASCII
        return False
    return True
