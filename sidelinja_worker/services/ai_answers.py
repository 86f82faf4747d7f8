"""What the AI gateway's answers say, read field by field: a chat completion's error or first
choice, an embeddings batch's vectors in input order, and the tokens each call cost. Every other
field is skipped unbuilt (msgspec); an answer that cannot be read is a RetryJob."""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from sidelinja_worker.queue.errors import PermanentError, RetryJob
from sidelinja_worker.services import bounded

# Tokens one call can report: far past any model's context; sums of a few still fit INTEGER.
MAX_TOKENS_PER_CALL = 100_000_000
_NOT_JSON = "AI gateway answered with a body that is not JSON"
_NOT_AN_OBJECT = "AI gateway answered with JSON that is not an object"
# A value in an error bigger than this as JSON is shown by its JSON's start, never built.
ERROR_VALUE_BYTES = 64 * 1024
_ERROR_METADATA = ("limit_source", "reasons", "provider_name", "provider_code", "model_slug")


@dataclass(frozen=True)
class Usage:
    """The tokens that calls cost, as their answers report them, and how many calls."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    calls: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.calls + other.calls,
        )


def _count(value: Any) -> int:
    if type(value) is float and value.is_integer():
        value = int(value)
    return value if type(value) is int and 0 <= value <= MAX_TOKENS_PER_CALL else 0


def _answer_fields(content: bytes, names: tuple[str, ...]) -> dict[str, msgspec.Raw]:
    """The named fields of an answer, every other field skipped unbuilt. A lone surrogate
    escape ("\\ud800"), which json reads and msgspec refuses, is read as '?', the character
    storable_text makes of one; a body that is not a JSON object retries."""
    try:
        try:
            found = bounded.fields(content, names)
        except ValueError:
            replaced = bounded.lone_surrogates_replaced(content)
            if replaced is None:
                raise
            found = bounded.fields(replaced, names)
    except ValueError:
        raise RetryJob(_NOT_JSON) from None
    if found is None:
        raise RetryJob(_NOT_AN_OBJECT)
    return found


@dataclass(frozen=True)
class ChatAnswer:
    """What a chat answer says: an error (the answer's own, or its first choice's), else the
    first choice's content (None when it has none) and the call's usage."""

    error: dict[str, Any] | None
    choice_error: dict[str, Any] | None
    content: str | None
    usage: Usage


def chat_answer(content: bytes) -> ChatAnswer:
    """The fields of a chat answer the worker reads; choices after the first are skipped. A
    field read that is not JSON (invalid UTF-8 in a string) is a body that is not JSON; one
    skipped is never checked."""
    try:
        return _chat_fields(_answer_fields(content, ("error", "choices", "usage")))
    except ValueError:
        raise RetryJob(_NOT_JSON) from None


def _chat_fields(found: dict[str, msgspec.Raw]) -> ChatAnswer:
    error = _error_object(found["error"])
    if error is not None:
        return ChatAnswer(error, None, None, Usage())
    first = bounded.first_item(found["choices"])
    choice = None if first is None else bounded.fields(first, ("message", "error", "finish_reason"))
    if choice is None:
        raise RetryJob("AI gateway answered without choices")
    usage = _usage(found["usage"])
    if bounded.is_truthy(choice["error"]) or bounded.field_text(choice["finish_reason"]) == "error":
        return ChatAnswer(None, _error_object(choice["error"]) or {}, None, usage)
    message = bounded.fields(choice["message"], ("content",))
    text = None if message is None else bounded.field_string(message["content"])
    return ChatAnswer(None, None, text, usage)


def _error_object(raw: msgspec.Raw) -> dict[str, Any] | None:
    """An error object's code, message and metadata as describe_error reads them, a value
    of more than ERROR_VALUE_BYTES as its JSON's start; None when `raw` is no object."""
    found = bounded.fields(raw, ("code", "message", "metadata"))
    if found is None:
        return None
    error = {name: _value(found[name]) for name in ("code", "message")}
    meta = bounded.fields(found["metadata"], _ERROR_METADATA)
    error["metadata"] = {} if meta is None else {k: _value(v) for k, v in meta.items()}
    return error


def _value(raw: msgspec.Raw) -> Any:
    return bounded.small_value(raw, ERROR_VALUE_BYTES)


_NUMBER = msgspec.json.Decoder(int | float)


def _usage(raw: msgspec.Raw) -> Usage:
    """The call's counts; one that cannot be true (not a whole number, negative, or past
    MAX_TOKENS_PER_CALL) reads as 0, unknown. The call is made and paid for by now: its report
    must not fail the job, as an infinity or a string did, nor a job that stores it later, as a
    count past an INTEGER column did."""
    found = bounded.fields(raw, ("prompt_tokens", "completion_tokens"))
    if found is None:
        return Usage(0, 0, 1)
    return Usage(
        _count(_number(found["prompt_tokens"])), _count(_number(found["completion_tokens"])), 1
    )


def _number(raw: msgspec.Raw) -> int | float | None:
    try:
        return _NUMBER.decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError):  # 1e999, a string, a list
        return None


@dataclass(frozen=True)
class EmbeddingsAnswer:
    """What an embeddings answer says: an error, else the vectors in input order, the model
    it names (None when it names none with a string) and the call's usage."""

    error: dict[str, Any] | None
    vectors: list[list[float]]
    model: str | None
    usage: Usage


_ITEMS = msgspec.json.Decoder(list[msgspec.Raw])
# Below this, a list of the wrong length is read whole to say how many items it holds: at most
# ~330,000 empty items, a few milliseconds.
COUNTED_ITEMS_BYTES = 1024 * 1024
_INDEX = msgspec.json.Decoder(int)
_VECTOR = msgspec.json.Decoder(list[float])
# Where msgspec stops on what it cannot read, in its message: "... (byte 123)".
_REFUSED_AT = re.compile(r"\(byte (\d+)\)")


def embeddings_answer(content: bytes, inputs: int, numbers: int) -> EmbeddingsAnswer:
    """The fields of an embeddings answer the worker reads, every other field skipped; a vector
    of more than `numbers` numbers is a PermanentError."""
    try:
        found = _answer_fields(content, ("error", "data", "model", "usage"))
    except RetryJob:
        if _non_finite_number(content):
            raise RetryJob(_NOT_NUMBERS) from None
        raise
    try:
        error = _error_object(found["error"])
        model = bounded.field_string(found["model"])
    except ValueError:
        raise RetryJob(_NOT_JSON) from None
    if error is not None:
        return EmbeddingsAnswer(error, [], None, Usage())
    vectors = _embedding_vectors(found["data"], inputs, numbers)
    return EmbeddingsAnswer(None, vectors, model or None, _usage(found["usage"]))


def _non_finite_number(content: bytes) -> bool:
    """Whether msgspec refuses `content` at a NaN or an Infinity, which json reads as numbers
    (and msgspec does not): a vector with one is refused as not finite, wherever it is."""
    try:
        msgspec.json.decode(content, type=msgspec.Raw)
    except msgspec.DecodeError as exc:
        found = _REFUSED_AT.search(str(exc))
        at = int(found.group(1)) if found else -1
        return at >= 0 and content[at : at + 9].lstrip(b"-").startswith((b"NaN", b"Infinity"))
    return False


@functools.lru_cache(maxsize=16)
def _items_decoder(inputs: int) -> msgspec.json.Decoder[tuple[msgspec.Raw, ...]]:
    """A list of exactly `inputs` items, each left unread: one more item, and msgspec stops
    there (a list of any length would be built whole before its length could be compared)."""
    return msgspec.json.Decoder(tuple.__class_getitem__((msgspec.Raw,) * inputs))


def _embedding_items(data: msgspec.Raw, inputs: int) -> Sequence[msgspec.Raw]:
    """The `inputs` items of the answer's list, unread; any other number is a RetryJob, found
    before the items past `inputs` are built: the 12 MB an answer for 16 inputs of unknown
    dimensions may hold fit 4.1 million items (250 MB and 0.26 s of the GIL as a list). A short
    list, or a long one in a small answer, is counted for the message."""
    if not bounded.is_truthy(data):
        items: Sequence[msgspec.Raw] = []
    else:
        try:
            return _items_decoder(inputs).decode(data)
        except msgspec.ValidationError:
            if len(data) > COUNTED_ITEMS_BYTES and memoryview(data)[:1] == b"[":
                raise RetryJob(
                    f"AI gateway returned a list that is not one embedding for each of the"
                    f" {inputs} inputs"
                ) from None
            try:
                items = _ITEMS.decode(data)
            except msgspec.ValidationError:
                raise RetryJob(_NOT_A_LIST) from None
    if len(items) == inputs:
        return items
    raise RetryJob(f"AI gateway returned {len(items)} embeddings for {inputs} inputs")


def _embedding_vectors(data: msgspec.Raw, inputs: int, numbers: int) -> list[list[float]]:
    """Each item's embedding as floats, in the order of the items' indexes, which are each of
    0 .. inputs-1 once (an absent index is 0): a gateway that batches inputs and numbers each
    sub-batch from 0 would store vectors against the wrong texts. Anything but a
    list of finite numbers is refused: json read NaN and Infinity (msgspec refuses both, and
    1e999), and a vector stored with one is never embedded again while its text is unchanged,
    every similarity with it NaN."""
    items = _embedding_items(data, inputs)
    indexed = []
    for raw in items:
        item = bounded.fields(raw, ("index", "embedding"))
        if item is None:
            raise RetryJob(_NOT_A_LIST)
        try:
            index = 0 if bounded.is_absent(item["index"]) else _INDEX.decode(item["index"])
        except msgspec.ValidationError:
            raise RetryJob(_NOT_A_LIST) from None
        indexed.append((index, item["embedding"]))
    indexed.sort(key=lambda pair: pair[0])
    if [index for index, _ in indexed] != list(range(inputs)):
        raise RetryJob(_NOT_EACH_INPUT.format(inputs=inputs))
    return [_vector(embedding, numbers) for _, embedding in indexed]


def _vector(raw: msgspec.Raw, numbers: int) -> list[float]:
    """The embedding's floats, refused unread when it holds more than `numbers`: the answer's
    byte cap assumes long numbers, and one of 2-byte numbers ("0,") held 24 times as many, a
    gigabyte of floats for a batch. Its commas are counted first, as msgspec builds a whole list
    before comparing its length with a limit (2.3 s and 500 MB for 12 million numbers)."""
    if bytes(raw).count(b",") >= numbers:
        raise PermanentError(f"AI gateway returned an embedding of more than {numbers} numbers")
    try:
        vector = _VECTOR.decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError):
        raise RetryJob(_NOT_NUMBERS) from None
    if not all(map(math.isfinite, vector)):
        raise RetryJob(_NOT_NUMBERS)
    return vector


_NOT_NUMBERS = "AI gateway returned an embedding that is not a list of numbers"
_NOT_A_LIST = "AI gateway answered with an embeddings list that cannot be read"
# An index repeated or past the inputs would store a vector against another input's text, with
# that text's hash: never embedded again while the text is unchanged.
_NOT_EACH_INPUT = (
    "AI gateway returned embedding indexes that are not each of the {inputs} inputs once"
)
