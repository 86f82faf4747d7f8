"""How `prompt_eval` scores an answer: the checks a test case can carry (exact, contains, regex,
JSON-schema valid, numeric tolerance; the LLM judge is run by the handler) and a small JSON
Schema validator.

The validator covers the keywords test sets use (type, enum, const, properties, required,
additionalProperties, items, min/maxItems, minimum/maximum, min/maxLength, pattern, anyOf);
other keywords are ignored, and a check stops past MAX_SCHEMA_STEPS. It is here rather than
the `jsonschema` package only because the project has no such dependency yet; swapping it in
changes `schema_errors` alone, which must keep a step budget."""

from __future__ import annotations

import json
import re
from collections.abc import Sized
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import re2
from pydantic import BaseModel, ConfigDict, Field, field_validator

# Patterns from tenants' test sets run on RE2: matching is linear in the answer's length
# whatever the pattern, where Python's engine can backtrack for hours. RE2 has no
# backreferences or lookaround: a regex check with such a pattern is refused with the payload
# (`pattern_error`), a JSON-schema `pattern` fails its check, saying so. Its \d, \w and \b are
# ASCII-only: write \pL for Norwegian letters. RE2 holds the GIL while it compiles, so a compile
# keeps the event loop waiting even from a thread: up to ~0.2 s for a pattern near max_mem.
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # an unsupported pattern is the case's result, not a log line
_RE2_OPTIONS.max_mem = 8 << 20  # a compiled pattern's memory; a bigger one fails its case
MAX_PATTERN_CHARS = 2000
# A regex check's pattern is checked when its job starts, in a thread, by RE2 on this small
# budget: RE2 parses the whole pattern before it compiles, so a syntax error or a construct it
# lacks shows here, while a program too big for the budget (a refusal this check ignores) stops
# compiling early. The longest pattern then costs at most ~0.07 s (666 times \PL: Unicode
# classes are what RE2's parser spends on). Python's re is no judge of these patterns: it
# refuses \pL and accepts backreferences, and its compile takes 2-3 s for some patterns of
# MAX_PATTERN_CHARS (a range under (?i) is case-folded code point by code point).
_PARSE_OPTIONS = re2.Options()
_PARSE_OPTIONS.log_errors = False
_PARSE_OPTIONS.max_mem = 64 << 10
_TOO_LARGE = "pattern too large"  # RE2's refusal of a program over max_mem
# A JSON-schema check's work is the case's schema times the model's answer, both outside input
# (a 100,000-value enum against a 10,000-item answer is 10^9 comparisons), and it runs in a
# thread the job's timeout cannot stop. So it has a budget of steps: an answer node visited, an
# enum member or const compared (a node, or CHARS_PER_STEP characters of a string, per step), a
# character searched by a pattern (SEARCH_CHARS_PER_STEP, below), and a distinct pattern
# compiled (RE2 takes up to ~0.2 s on a short pattern of big classes and counted repeats). A
# step is about a microsecond, a search's up to four: the check ends within a few seconds
# whatever it is given, far above what a real test case takes; past the budget the check
# fails, saying so.
MAX_SCHEMA_STEPS = 1_000_000
COMPILE_STEPS = 100_000
CHARS_PER_STEP = 64
# RE2's search is linear in the text, but not cheap for every pattern: a big program whose DFA
# outgrows its memory falls back to slower engines, 4 µs a character for [\pL\pN ]{20,200}x
# (1.2 s for 300,000 characters), where a plain pattern takes nanoseconds. So a search costs
# the schema check a step per character searched, and a regex check searches the answer's
# first MAX_SEARCH_CHARS characters (a model may answer up to the gateway's 16 MB, and 20 such
# checks took 20 minutes of a thread the job's timeout cannot stop; now under a second each).
SEARCH_CHARS_PER_STEP = 1
MAX_SEARCH_CHARS = 200_000
NUMBER = re.compile(r"-?\d+(?:[.,]\d+)?")
_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "boolean": (bool,),
    "integer": (int,),
    "number": (int, float),
    "null": (type(None),),
}


class _Check(BaseModel):
    model_config = ConfigDict(frozen=True, populate_by_name=True)


class ExactCheck(_Check):
    kind: Literal["exact"]
    value: str
    ignore_case: bool = False


class ContainsCheck(_Check):
    kind: Literal["contains"]
    value: str = Field(min_length=1)
    ignore_case: bool = False


class RegexCheck(_Check):
    """Whether the answer matches `pattern` somewhere. The payload is read on the event loop, so
    the pattern's syntax is checked later, in the job's thread (`pattern_error`)."""

    kind: Literal["regex"]
    pattern: str = Field(min_length=1, max_length=MAX_PATTERN_CHARS)


class JsonSchemaCheck(_Check):
    kind: Literal["json_schema"]
    json_schema: dict[str, Any] = Field(alias="schema")

    @field_validator("json_schema")
    @classmethod
    def _applies(cls, value: dict[str, Any]) -> dict[str, Any]:
        _check_schema(value, "schema", 0)
        return value


# How deep a case's schema may nest: the check recurses along the schema, and a schema past
# Python's recursion limit failed the case's job as a transient fault, retried for the same
# schema (and the model calls paid again).
MAX_SCHEMA_DEPTH = 64
_COUNTS = ("minItems", "maxItems", "minLength", "maxLength")
_BOUNDS = ("minimum", "maximum")


def _check_schema(schema: Any, where: str, depth: int) -> None:
    """Refuses, when the payload is read, a schema whose keywords `schema_errors` reads could
    not be applied: each keyword of the subset must have its JSON Schema type (`{"enum": 5}`
    or a string `minimum` raised a TypeError in the check, a transient fault, retried for
    ever for the same case)."""
    if not isinstance(schema, dict):
        raise ValueError(f"{where}: a schema is an object")
    if depth > MAX_SCHEMA_DEPTH:
        raise ValueError(f"{where}: nested deeper than {MAX_SCHEMA_DEPTH} levels")
    kind = schema.get("type")
    if kind is not None and not (
        isinstance(kind, str) or (isinstance(kind, list) and all(isinstance(k, str) for k in kind))
    ):
        raise ValueError(f"{where}.type: a name or a list of names")
    if "enum" in schema and not isinstance(schema["enum"], list):
        raise ValueError(f"{where}.enum: a list")
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise ValueError(f"{where}.required: a list of names")
    for key in _COUNTS:
        if key in schema and (type(schema[key]) is not int or schema[key] < 0):
            raise ValueError(f"{where}.{key}: a whole number from 0")
    for key in _BOUNDS:
        if key in schema and type(schema[key]) not in (int, float):
            raise ValueError(f"{where}.{key}: a number")
    if "pattern" in schema and not isinstance(schema["pattern"], str):
        raise ValueError(f"{where}.pattern: a string")
    props = schema.get("properties", {})
    if not isinstance(props, dict):
        raise ValueError(f"{where}.properties: an object")
    for name, sub in props.items():
        _check_schema(sub, f"{where}.properties.{name}", depth + 1)
    if isinstance(schema.get("items"), dict):
        _check_schema(schema["items"], f"{where}.items", depth + 1)
    if "anyOf" in schema:
        if not isinstance(schema["anyOf"], list):
            raise ValueError(f"{where}.anyOf: a list of schemas")
        for i, sub in enumerate(schema["anyOf"]):
            _check_schema(sub, f"{where}.anyOf[{i}]", depth + 1)


class NumericCheck(_Check):
    kind: Literal["numeric"]
    value: float
    tolerance: float = Field(default=0.0, ge=0)


class JudgeCheck(_Check):
    kind: Literal["judge"]
    criteria: str = Field(min_length=1)


Check = Annotated[
    ExactCheck | ContainsCheck | RegexCheck | JsonSchemaCheck | NumericCheck | JudgeCheck,
    Field(discriminator="kind"),
]


@dataclass(frozen=True)
class Score:
    kind: str
    passed: bool
    detail: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "passed": self.passed, "detail": self.detail}


def score_all(checks: list[Check], output: str) -> list[Score]:
    """Every non-judge check of `output`, in order."""
    return [score(c, output) for c in checks if not isinstance(c, JudgeCheck)]


def score(check: Check, output: str) -> Score:
    """One non-judge check of `output`."""
    text = output.strip()
    if isinstance(check, ExactCheck):
        a, b = (
            (text.casefold(), check.value.strip().casefold())
            if check.ignore_case
            else (text, check.value.strip())
        )
        return Score("exact", a == b)
    if isinstance(check, ContainsCheck):
        a, b = (
            (text.casefold(), check.value.casefold()) if check.ignore_case else (text, check.value)
        )
        return Score("contains", b in a)
    if isinstance(check, RegexCheck):
        return _regex_score(check.pattern, output)
    if isinstance(check, JsonSchemaCheck):
        return _json_score(check.json_schema, text)
    if isinstance(check, NumericCheck):
        return _numeric_score(check, text)
    raise TypeError(f"{check.kind} is scored by the judge")


def linear_search(pattern: str, text: str) -> bool:
    """Whether `pattern` matches somewhere in `text`, on RE2. Raises ValueError, with RE2's
    reason, for a pattern RE2 cannot run."""
    return _compile(pattern).search(text) is not None


def pattern_error(pattern: str) -> str | None:
    """RE2's reason it cannot run `pattern` (a syntax error, a backreference, lookaround), or
    None; a pattern too big for RE2's memory is left to its check, which fails saying so. CPU
    for up to ~0.07 s (see _PARSE_OPTIONS): call it from a thread."""
    try:
        _compile(pattern, _PARSE_OPTIONS)
    except ValueError as exc:  # a UnicodeEncodeError too: a lone surrogate is no UTF-8
        reason = str(exc)
        return None if reason.startswith(_TOO_LARGE) else reason
    return None


def _compile(pattern: str, options: Any = _RE2_OPTIONS) -> Any:  # re2 ships no types
    try:
        return re2.compile(pattern, options)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else exc
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise ValueError(str(reason)) from None


def _regex_score(pattern: str, output: str) -> Score:
    """Whether the pattern matches in the answer's first MAX_SEARCH_CHARS characters; a miss
    in a longer answer says how far the check looked."""
    try:
        if linear_search(pattern, output[:MAX_SEARCH_CHARS]):
            return Score("regex", True)
        if len(output) <= MAX_SEARCH_CHARS:
            return Score("regex", False)
        return Score(
            "regex",
            False,
            f"not found in the answer's first {MAX_SEARCH_CHARS:,} characters (of "
            f"{len(output):,}); a regex check searches no further",
        )
    except ValueError as exc:
        return Score(
            "regex",
            False,
            f"pattern not supported by the linear-time engine (RE2: {exc}); "
            "backreferences and lookaround are not available",
        )


def _json_score(schema: dict[str, Any], text: str) -> Score:
    if text.startswith("```") and text.endswith("```"):
        text = text[3:-3].split("\n", 1)[-1] if "\n" in text else text[3:-3]
    try:
        value = json.loads(text)
    except ValueError as exc:
        return Score("json_schema", False, f"not JSON: {exc}")
    except RecursionError:  # the parser recurses per level: 100 kB of '[' is enough
        return Score(
            "json_schema", False, "not JSON: nested deeper than the parser's recursion limit"
        )
    errors = schema_errors(schema, value)
    return Score("json_schema", not errors, "; ".join(errors[:3]) or None)


def _numeric_score(check: NumericCheck, text: str) -> Score:
    found = NUMBER.search(text.replace("\u2212", "-").replace("\u00a0", "").replace(" ", ""))
    if found is None:
        return Score("numeric", False, "no number in the answer")
    got = float(found.group().replace(",", "."))
    return Score("numeric", abs(got - check.value) <= check.tolerance, f"got {got:g}")


class _OverBudget(Exception):
    pass


class _Walk:
    """One schema check's spent steps, and the patterns it has compiled (each distinct pattern
    once, however many strings it is matched with)."""

    def __init__(self, steps: int) -> None:
        self.left = steps
        self.patterns: dict[str, Any] = {}  # compiled, or why RE2 refused it

    def spend(self, steps: int) -> None:
        self.left -= steps
        if self.left < 0:
            raise _OverBudget

    def compare(self, value: Any, members: int) -> None:
        """Pays for comparing `value` with `members` values (an enum's, or a const)."""
        self.spend(members * _weight(value, self.left // max(members, 1) + 1))

    def search(self, pattern: str, text: str) -> bool:
        """Whether `pattern` matches in `text`; raises ValueError for a pattern RE2 refuses."""
        compiled = self.patterns.get(pattern)
        if compiled is None:
            self.spend(COMPILE_STEPS)
            try:
                compiled = self.patterns[pattern] = _compile(pattern)
            except ValueError as exc:
                compiled = self.patterns[pattern] = str(exc)
        if isinstance(compiled, str):
            raise ValueError(compiled)
        self.spend(1 + len(text) // SEARCH_CHARS_PER_STEP)
        return compiled.search(text) is not None


def _weight(value: Any, cap: int) -> int:
    """What comparing `value` with one other value can cost, in steps: a step per node and per
    CHARS_PER_STEP characters of a string (equal-length strings compare character by
    character); the count stops past `cap`."""
    steps, stack = 0, [value]
    while stack and steps <= cap:
        item = stack.pop()
        steps += 1
        if isinstance(item, str):
            steps += len(item) // CHARS_PER_STEP
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return steps


def schema_errors(schema: dict[str, Any], value: Any, where: str = "$") -> list[str]:
    """What in `value` breaks `schema` (the subset named in the module docstring); within
    MAX_SCHEMA_STEPS, past which that is the one error."""
    try:
        return _errors(schema, value, where, _Walk(MAX_SCHEMA_STEPS))
    except _OverBudget:
        return [
            f"{where}: the check took more than its budget of {MAX_SCHEMA_STEPS:,} steps "
            "(schema size × answer size)"
        ]


def _errors(schema: dict[str, Any], value: Any, where: str, walk: _Walk) -> list[str]:
    walk.spend(1)
    if "anyOf" in schema and all(_errors(sub, value, where, walk) for sub in schema["anyOf"]):
        return [f"{where}: matches none of anyOf"]
    if "enum" in schema:
        enum = schema["enum"]
        walk.compare(value, len(enum) if isinstance(enum, Sized) else 1)
        if value not in enum:
            return [f"{where}: {value!r} not in enum"]
    if "const" in schema:
        walk.compare(value, 1)
        if value != schema["const"]:
            return [f"{where}: not {schema['const']!r}"]
    kind = schema.get("type")
    if kind is not None and not _is_type(value, kind):
        return [f"{where}: expected {kind}"]
    if isinstance(value, dict):
        return _object_errors(schema, value, where, walk)
    if isinstance(value, list):
        return _array_errors(schema, value, where, walk)
    return _scalar_errors(schema, value, where, walk)


def _is_type(value: Any, kind: str | list[str]) -> bool:
    kinds = [kind] if isinstance(kind, str) else kind
    if isinstance(value, bool):
        return "boolean" in kinds
    return any(isinstance(value, _TYPES.get(k, ())) for k in kinds)


def _object_errors(
    schema: dict[str, Any], value: dict[str, Any], where: str, walk: _Walk
) -> list[str]:
    errors = [
        f"{where}: missing {name!r}" for name in schema.get("required", []) if name not in value
    ]
    props = schema.get("properties", {})
    for name, sub in value.items():
        if name in props:
            errors += _errors(props[name], sub, f"{where}.{name}", walk)
        elif schema.get("additionalProperties") is False:
            errors.append(f"{where}: unexpected {name!r}")
    return errors


def _array_errors(schema: dict[str, Any], value: list[Any], where: str, walk: _Walk) -> list[str]:
    errors = []
    if len(value) < schema.get("minItems", 0):
        errors.append(f"{where}: fewer than {schema['minItems']} items")
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        errors.append(f"{where}: more than {schema['maxItems']} items")
    if isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            errors += _errors(schema["items"], item, f"{where}[{i}]", walk)
    return errors


def _scalar_errors(schema: dict[str, Any], value: Any, where: str, walk: _Walk) -> list[str]:
    errors = []
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(f"{where}: below {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(f"{where}: above {schema['maximum']}")
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            errors.append(f"{where}: shorter than {schema['minLength']}")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append(f"{where}: longer than {schema['maxLength']}")
        if "pattern" in schema:
            try:
                if not walk.search(str(schema["pattern"]), value):
                    errors.append(f"{where}: does not match {schema['pattern']!r}")
            except ValueError as exc:
                errors.append(f"{where}: pattern {schema['pattern']!r} not supported (RE2: {exc})")
    return errors
