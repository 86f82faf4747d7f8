"""Property-based tests (hypothesis) of every payload model and every parser that takes input
from outside: each asserts the documented outcome for arbitrary input, not merely that
nothing crashed.

- payloads: any JSON value is a valid payload model or a PermanentError "invalid payload: …";
  a valid payload survives a JSON round trip unchanged.
- SRT: any text parses or fails with SrtError naming an existing line; well-formed cues
  parse to exactly what was written, whatever the BOM, line ends and final newline.
- stats settings' interval: a number of seconds from 60 s to 31 days, or a PermanentError
  naming `settings stats.interval`.
- prompt_eval scoring: every check gives a Score; a pattern RE2 cannot run is refused with
  the payload, and fails its check saying why; a literal pattern matches exactly where the
  text contains it; numeric checks find the number written.
- Caddy log lines: any bytes decode to an entry or None; any block counts each non-blank line.
- AI text splitting: parts join back to the text, each within the budget; combine groups keep
  every item in order and at least halve the count."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from sidelinja_worker.jobs.ai.text import group_for_combine, split_text
from sidelinja_worker.jobs.catalog import REGISTRY
from sidelinja_worker.jobs.knowledge.prompt_eval_scoring import (
    ContainsCheck,
    NumericCheck,
    RegexCheck,
    Score,
    linear_search,
    pattern_error,
    score,
)
from sidelinja_worker.jobs.stats.counting import EpisodeRules, Tally
from sidelinja_worker.jobs.stats.records import decode
from sidelinja_worker.jobs.stats.stats_parse import StatsSettings
from sidelinja_worker.jobs.transcripts.subtitles import Segment, SrtError, clean_text, parse_srt
from sidelinja_worker.queue.errors import PermanentError
from tests.test_stats_counting import line

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner),
    max_leaves=12,
)


def _payload_keys(job_type: str) -> st.SearchStrategy[str]:
    fields = list(REGISTRY[job_type].payload_model.model_fields)
    return st.sampled_from(fields) if fields else st.text(max_size=8)


@pytest.mark.parametrize("job_type", sorted(REGISTRY))
@SETTINGS
@given(data=st.data())
def test_any_json_is_a_valid_payload_or_an_invalid_payload_error(
    job_type: str, data: st.DataObject
) -> None:
    # Objects with the model's own keys (so validation goes deep), and any JSON at all.
    keys = _payload_keys(job_type)
    raw = data.draw(st.dictionaries(keys | st.text(max_size=8), JSON, max_size=6) | JSON)
    jt = REGISTRY[job_type]
    try:
        model = jt.parse_payload(raw)
    except PermanentError as exc:
        refused: PermanentError | None = exc
    else:
        refused = None
    if refused is not None:
        assert str(refused).startswith("invalid payload: ")
        return
    again = jt.parse_payload(json.loads(model.model_dump_json(by_alias=True)))
    assert again == model


TEXT_LINE = st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="<>{}&\\"),
    min_size=1,
    max_size=40,
).filter(lambda s: s.strip() and not s.strip().isdigit() and "-->" not in s and "->" not in s)


def _stamp(ms: int) -> str:
    h, rest = divmod(ms, 3_600_000)
    m, rest = divmod(rest, 60_000)
    s, milli = divmod(rest, 1000)
    return f"{h:02d}:{m:02d}:{s:02d},{milli:03d}"


@SETTINGS
@given(
    cues=st.lists(
        st.tuples(
            st.integers(0, 10**8),
            st.integers(0, 10**6),
            st.lists(TEXT_LINE, min_size=1, max_size=3),
        ),
        max_size=8,
    ),
    crlf=st.booleans(),
    bom=st.booleans(),
    final_newline=st.booleans(),
)
def test_well_formed_cues_parse_to_what_was_written(
    cues: list[tuple[int, int, list[str]]], crlf: bool, bom: bool, final_newline: bool
) -> None:
    # A text line that looks like a timing line would be read as one: not well-formed text.
    assume(all(not re.match(r"\s*\d{1,3}[:.,]\d", t) for _, _, lines in cues for t in lines))
    blocks = [
        f"{i}\n{_stamp(start)} --> {_stamp(start + length)}\n" + "\n".join(lines)
        for i, (start, length, lines) in enumerate(cues, 1)
    ]
    text = "\n\n".join(blocks) + ("\n" if final_newline else "")
    if crlf:
        text = text.replace("\n", "\r\n")
    expected = tuple(
        Segment(start, start + length, clean_text("\n".join(lines)))
        for start, length, lines in cues
        if clean_text("\n".join(lines))
    )
    assert parse_srt(("\ufeff" if bom else "") + text).segments == expected


@SETTINGS
@given(text=st.text(alphabet=st.sampled_from("0123456789:,.->\n \r\ta<i>&;\x00O"), max_size=200))
def test_any_text_parses_or_names_an_existing_line(text: str) -> None:
    try:
        transcript = parse_srt(text)
    except SrtError as exc:
        error: SrtError | None = exc
    else:
        error = None
    if error is not None:
        lines = text.lstrip("\ufeff").replace("\r\n", "\n").replace("\r", "\n").split("\n")
        assert 1 <= error.line <= len(lines)
        assert str(error).startswith(f"malformed SRT at line {error.line}: ")
        return
    assert all(0 <= s.start_ms <= s.end_ms and s.text for s in transcript.segments)


@SETTINGS
@given(value=st.text(max_size=20) | st.floats() | st.integers(-(10**12), 10**12))
def test_a_stats_interval_is_a_usable_number_of_seconds_or_a_named_error(value: Any) -> None:
    try:
        settings_ = StatsSettings.model_validate({"interval": value})
    except ValueError:
        return  # pydantic refuses it: reported as "workspace settings stats: …" by the job
    try:
        seconds = settings_.interval_s()
    except PermanentError as exc:
        refused: PermanentError | None = exc
    else:
        refused = None
    if refused is not None:
        assert str(refused).startswith("settings stats.interval: ")
        return
    assert 60.0 <= seconds <= 31 * 86400.0


@SETTINGS
@given(needle=st.text(min_size=1, max_size=10), hay=st.text(max_size=60))
def test_a_literal_pattern_matches_exactly_where_the_text_contains_it(
    needle: str, hay: str
) -> None:
    for text in (hay, hay + needle + hay):
        assert linear_search(re.escape(needle), text) is (needle in text)
        got = score(RegexCheck(kind="regex", pattern=re.escape(needle)), text)
        assert got == Score("regex", needle in text)
        contains = score(ContainsCheck(kind="contains", value=needle), text)
        assert contains.passed is (needle in text.strip())


@SETTINGS
@given(
    number=st.integers(-(10**9), 10**9),
    before=st.text(alphabet="abc ", max_size=10),
    after=st.text(alphabet="abc ", max_size=10),
)
def test_a_numeric_check_finds_the_number_written(number: int, before: str, after: str) -> None:
    got = score(NumericCheck(kind="numeric", value=number), f"{before}{number}{after}")
    assert got.passed and got.detail == f"got {float(number):g}"


@SETTINGS
@given(
    pattern=st.text(min_size=1, max_size=30),
    output=st.text(max_size=200),
)
def test_any_pattern_scores_or_is_refused_saying_why(pattern: str, output: str) -> None:
    refused = pattern_error(pattern)  # refused with the payload when its job starts
    got = score(RegexCheck(kind="regex", pattern=pattern), output)
    assert got.kind == "regex" and isinstance(got.passed, bool)
    if refused is not None:
        assert (got.passed, got.detail) == (
            False,
            f"pattern not supported by the linear-time engine (RE2: {refused}); "
            "backreferences and lookaround are not available",
        )
    elif got.detail is not None:  # too big for RE2's memory: the check fails, saying so
        assert not got.passed and "pattern too large" in got.detail


@SETTINGS
@given(raw=st.binary(max_size=300))
def test_any_bytes_decode_to_a_log_entry_or_none(raw: bytes) -> None:
    got = decode(raw)
    assert got is None or got.status is not None


@SETTINGS
@given(
    junk=st.lists(st.binary(max_size=80).filter(lambda b: b"\n" not in b), max_size=6),
    ips=st.lists(st.integers(1, 250), max_size=6),
)
def test_any_block_counts_every_non_blank_line_and_every_good_listener(
    junk: list[bytes], ips: list[int]
) -> None:
    good = [line(ip=f"198.51.100.{n}", status=200, range_=None) for n in ips]
    block = b"".join(good) + b"".join(j + b"\n" for j in junk)
    tally = Tally(EpisodeRules())
    tally.add_block(block)
    nonblank = len(good) + sum(1 for j in junk if j.strip())
    assert tally.lines == nonblank
    assert tally.bad_lines <= nonblank - len(good)
    assert {key[2] for key in tally.listens} >= {f"198.51.100.{n}" for n in ips}


@SETTINGS
@given(text=st.text(max_size=500), budget=st.integers(1, 60))
def test_splitting_loses_no_character_and_keeps_to_the_budget(text: str, budget: int) -> None:
    parts = split_text(text, budget)
    assert "".join(parts) == text
    assert all(len(p) <= budget for p in parts) or (len(parts) == 1 and len(text) <= budget)


@SETTINGS
@given(items=st.lists(st.text(max_size=30), min_size=1, max_size=30), budget=st.integers(1, 80))
def test_combine_groups_keep_every_item_and_at_least_halve_the_count(
    items: list[str], budget: int
) -> None:
    groups = group_for_combine(items, budget)
    assert [i for g in groups for i in g] == items
    if len(items) > 1:
        assert all(len(g) >= 2 for g in groups) and len(groups) <= len(items) // 2
