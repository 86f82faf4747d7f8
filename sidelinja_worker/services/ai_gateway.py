"""The OpenAI-compatible AI gateway (OpenRouter): strict structured chat completions and
embeddings, with the gateway's errors mapped to the job outcomes (RetryJob / PermanentError).
What its answers say is read in ai_answers, its request bodies are encoded in ai_requests and
its errors are described in ai_errors."""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from sidelinja_worker.queue.config import Secret
from sidelinja_worker.queue.context import Services
from sidelinja_worker.queue.errors import PermanentError, RetryJob
from sidelinja_worker.queue.limits import RateLimiter
from sidelinja_worker.queue.registry import describe_validation_error
from sidelinja_worker.services import ai_errors, bounded
from sidelinja_worker.services.ai_answers import Usage, chat_answer, embeddings_answer
from sidelinja_worker.services.ai_errors import describe_error, error_object
from sidelinja_worker.services.ai_requests import encoded_body, in_pieces, storable_text
from sidelinja_worker.services.classify import scrub

log = logging.getLogger("sidelinja_worker.ai_gateway")

RATE_KEY = "ai_gateway"  # the rate_limits row every worker shares; a 429 pauses it
# A structured answer for a long transcript part can take minutes on a slow model; an
# embeddings batch takes seconds. The job's own timeout bounds the whole map-reduce.
CHAT_TIMEOUT_S = 180.0
EMBED_TIMEOUT_S = 60.0
CONNECT_TIMEOUT_S = 10.0
# Caps on an answer's size. A chat answer is text of at most a few hundred thousand tokens;
# an embeddings batch of 2048 inputs x 3072 dimensions as JSON floats is ~130 MB, a default
# batch (64 x 1536) ~2 MB.
MAX_CHAT_BYTES = 16 * 1024 * 1024
MAX_EMBED_BYTES = 160 * 1024 * 1024
# An embeddings answer is also bounded by what was asked: so many vectors of so many numbers,
# each number at most 48 bytes of JSON (24 characters of a float, a separator and a pretty
# printer's indent), plus the item's and the answer's own fields. Its size is the time its
# parse holds the GIL, in a thread too (~6 ms a MB here), and with it every job's event loop:
# 160 MB was a second. Without `dimensions`, pgvector's most (16,000) is assumed. Shorter
# numbers fit more of them in these bytes ("0," 24 times as many): each vector's numbers are
# counted before it is read (ai_answers), none longer than asked for or than pgvector stores.
EMBED_NUMBER_BYTES = 48
EMBED_ITEM_BYTES = 1024
EMBED_ANSWER_BYTES = 64 * 1024
MAX_EMBED_DIMENSIONS = 16_000
# Statuses that will not change on a retry: bad request, bad key, no
# credits, moderation. 404/413/422 are bad requests too (unknown model, input too large).
PERMANENT_STATUSES = frozenset({400, 401, 402, 403, 404, 413, 422})
# A structured answer longer than twice the request's text plus this is refused unparsed, as a
# mismatch the model is told about. Validating is one call that holds the GIL, so the event loop,
# even in a thread, for as long as it takes: 0.46 s for an answer of 300,000 action points. A
# model's answer is bounded by its output tokens, far below this; a summary is shorter than its
# text, a cleaned-up dictation about as long.
MIN_ANSWER_LIMIT_CHARS = 256 * 1024
# Keywords strict structured outputs reject on some providers (OpenAI lists no string length
# limits); the answer is still validated against the full pydantic model afterwards.
_DROPPED_KEYWORDS = frozenset({"title", "default", "minLength", "maxLength"})

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class Structured(Generic[M]):
    value: M
    usage: Usage


@dataclass(frozen=True)
class Embeddings:
    vectors: list[list[float]]
    model: str
    usage: Usage


class GuardError(PermanentError):
    """A call this job may not make: a model its workspace does not allow, or one paid call
    past its limit. Never a per-case failure: the whole job stops."""


@dataclass
class CallGuard:
    """What one job may spend through the gateway: the models it may name and how many paid
    calls (chat completions, embeddings requests, a structured answer's second try included)
    it may make. `models_rule` and `calls_rule` name the settings, for the error."""

    models: frozenset[str]
    max_calls: int
    models_rule: str
    calls_rule: str
    calls: int = 0

    def allow_model(self, model: str) -> None:
        if model not in self.models:
            raise GuardError(
                f"model {model!r} is not allowed in this workspace ({self.models_rule})"
            )

    def spend(self, model: str) -> None:
        self.allow_model(model)
        if self.calls >= self.max_calls:
            raise GuardError(
                f"this job is past its limit of {self.max_calls} paid AI calls ({self.calls_rule})"
            )
        self.calls += 1


class AnswerMismatch(Exception):
    """The model's answer is not JSON matching the schema; the message says how."""


class AiGateway:
    def __init__(
        self,
        http: httpx.AsyncClient,
        base_url: str,
        key: Secret,
        limiter: RateLimiter,
        guard: CallGuard | None = None,
    ) -> None:
        self._http = http
        self._url = base_url.rstrip("/")
        self._key = key
        self._limiter = limiter
        self.guard = guard

    @classmethod
    def from_services(cls, services: Services, guard: CallGuard | None = None) -> AiGateway:
        return cls(
            services.http,
            services.config.require("AI_GATEWAY_URL"),
            services.config.secret("AI_GATEWAY_KEY"),
            services.limiter,
            guard,
        )

    async def structured(
        self, model: str, messages: list[dict[str, str]], answer: type[M]
    ) -> Structured[M]:
        """A chat completion whose answer must validate as `answer`. A mismatch is asked again
        once, with the validation error fed back; a second mismatch fails the job."""
        body = chat_body(model, messages, answer)
        limit = answer_limit_chars(messages)
        content, usage = await self.chat(body)
        try:
            return Structured(await _parsed(answer, content, limit), usage)
        except AnswerMismatch as exc:
            problem = str(exc)
        log.info(
            "%s answer did not match %s (%s); asking once more", model, answer.__name__, problem
        )
        body["messages"] = [
            *messages,
            {"role": "assistant", "content": content or ""},
            {"role": "user", "content": retry_instruction(problem)},
        ]
        content, more = await self.chat(body)
        try:
            return Structured(await _parsed(answer, content, limit), usage + more)
        except AnswerMismatch as exc:
            raise PermanentError(
                f"the model's answer did not match the {answer.__name__} "
                f"schema twice: {self._redact(str(exc))}"
            ) from None

    async def chat(self, body: Mapping[str, Any]) -> tuple[str | None, Usage]:
        """One chat completion: the answer's content and the tokens it cost. Errors that arrive
        with HTTP 200 (generation failed after it started) are classified like HTTP errors."""
        if self.guard is not None:
            self.guard.spend(str(body.get("model")))
        content = await self._post_raw("/chat/completions", body, CHAT_TIMEOUT_S, MAX_CHAT_BYTES)
        answer = await bounded.off_loop(chat_answer, content)
        if answer.error is not None:
            raise self._classify(200, answer.error, None)
        if answer.choice_error is not None:
            raise self._classify(200, answer.choice_error, None)
        if answer.content is None:
            return None, answer.usage
        return await storable_text(answer.content), answer.usage

    async def embeddings(
        self, model: str, inputs: Sequence[str], *, dimensions: int | None = None
    ) -> Embeddings:
        """`POST /embeddings` (OpenAI shape): one vector per input, in input order."""
        body: dict[str, Any] = {"model": model, "input": list(inputs), "encoding_format": "float"}
        if dimensions is not None:
            body["dimensions"] = dimensions
        if self.guard is not None:
            self.guard.spend(model)
        max_bytes = embeddings_answer_bytes(len(inputs), dimensions)
        content = await self._post_raw("/embeddings", body, EMBED_TIMEOUT_S, max_bytes)
        # Millions of numbers in a big batch: read in a thread, off the event loop. No vector
        # may be longer than asked for, nor than pgvector stores.
        numbers = min(dimensions or MAX_EMBED_DIMENSIONS, MAX_EMBED_DIMENSIONS)
        answer = await bounded.off_loop(embeddings_answer, content, len(inputs), numbers)
        if answer.error is not None:
            raise self._classify(200, answer.error, None)
        return Embeddings(answer.vectors, answer.model or model, answer.usage)

    async def _post_raw(
        self, path: str, body: Mapping[str, Any], timeout_s: float, max_bytes: int
    ) -> bytes:
        """The answer's body, unparsed: read field by field by whoever asked for it."""
        return (await self._answer(path, body, timeout_s, max_bytes)).content

    async def _answer(
        self, path: str, body: Mapping[str, Any], timeout_s: float, max_bytes: int
    ) -> httpx.Response:
        """A successful answer; any other status is raised as the job's outcome."""
        content = await encoded_body(body)
        await self._limiter.acquire(RATE_KEY)
        try:
            resp = await bounded.send(
                self._http,
                "POST",
                self._url + path,
                service="AI gateway",
                max_bytes=max_bytes,
                deadline_s=timeout_s + CONNECT_TIMEOUT_S,
                content=in_pieces(content),
                headers={**self._headers(), "Content-Length": str(len(content))},
                timeout=httpx.Timeout(timeout_s, connect=CONNECT_TIMEOUT_S),
            )
        except httpx.TimeoutException:
            raise RetryJob(f"AI gateway did not answer within {timeout_s:g} s") from None
        except httpx.TransportError as exc:
            raise RetryJob(f"AI gateway unreachable ({type(exc).__name__})") from None
        if resp.status_code >= 300:
            await self._raise_for_status(resp)
        return resp

    async def _raise_for_status(self, resp: httpx.Response) -> None:
        retry_after_s = ai_errors.retry_after_s(resp)
        if resp.status_code == 429 and retry_after_s is not None:
            # The limit is per account, so every worker must hold back, not just this job.
            await self._limiter.pause(RATE_KEY, retry_after_s)
        raise self._classify(resp.status_code, error_object(resp), retry_after_s)

    def _classify(
        self, status: int, error: Mapping[str, Any], retry_after_s: float | None
    ) -> Exception:
        code = error.get("code") if isinstance(error.get("code"), int) else status
        text = self._redact(describe_error(code, error))
        if code in PERMANENT_STATUSES and not (code == 402 and retry_after_s is not None):
            return PermanentError(text)
        return RetryJob(text, after_s=retry_after_s)

    def _headers(self) -> dict[str, str]:
        return {
            "Authorization": f"Bearer {self._key.reveal()}",
            "X-Title": "Sidelinja",
            "Content-Type": "application/json",
        }

    def _redact(self, text: str) -> str:
        """A gateway or provider may echo the request; the key, whole or cut, must never reach
        error_msg (classify.scrub)."""
        return scrub(text, [self._key.reveal()])


def embeddings_answer_bytes(inputs: int, dimensions: int | None) -> int:
    """The most bytes an answer with `inputs` vectors of `dimensions` numbers may hold."""
    numbers = min(dimensions or MAX_EMBED_DIMENSIONS, MAX_EMBED_DIMENSIONS)
    per_item = EMBED_ITEM_BYTES + numbers * EMBED_NUMBER_BYTES
    return min(MAX_EMBED_BYTES, EMBED_ANSWER_BYTES + inputs * per_item)


def chat_body(
    model: str, messages: list[dict[str, str]], answer: type[BaseModel]
) -> dict[str, Any]:
    """A strict json_schema request, routed only to providers that honour every parameter."""
    return {
        "model": model,
        "messages": list(messages),
        "response_format": {
            "type": "json_schema",
            "json_schema": {
                "name": answer.__name__,
                "strict": True,
                "schema": strict_schema(answer),
            },
        },
        "provider": {"require_parameters": True},
    }


def retry_instruction(problem: str) -> str:
    return (
        f"Your answer did not match the required JSON schema: {problem}. "
        "Answer again with only a JSON object that matches the schema."
    )


def answer_limit_chars(messages: Sequence[Mapping[str, str]]) -> int:
    """The longest structured answer taken for a request of `messages`."""
    return 2 * sum(len(m.get("content") or "") for m in messages) + MIN_ANSWER_LIMIT_CHARS


async def _parsed(answer: type[M], content: str | None, limit_chars: int) -> M:
    """`parse_answer`, in a thread for a big answer: validating megabytes of JSON is CPU. An
    answer over `limit_chars` is a mismatch unparsed (see MIN_ANSWER_LIMIT_CHARS)."""
    if content is not None and len(content) > limit_chars:
        raise AnswerMismatch(
            f"the answer is {len(content)} characters, more than the {limit_chars} allowed "
            "for this request; answer concisely"
        )
    if content is None:
        return parse_answer(answer, content)
    return await bounded.off_loop(functools.partial(parse_answer, answer), content)


def parse_answer(answer: type[M], content: str | None) -> M:
    if not content or not content.strip():
        raise AnswerMismatch("the answer was empty")
    try:
        return answer.model_validate_json(_strip_fences(content))
    except ValidationError as exc:
        raise AnswerMismatch(describe_validation_error(exc)) from None


def _strip_fences(content: str) -> str:
    """Some models wrap JSON in a Markdown fence even in JSON mode."""
    text = content.strip()
    if text.startswith("```") and text.endswith("```"):
        text = text[3:-3]
        text = text[text.index("\n") + 1 :] if "\n" in text else text
    return text.strip()


def strict_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema in the form strict structured outputs accept: references
    inlined, every property required (optional ones are nullable), no extra properties."""
    raw = model.model_json_schema()
    defs = raw.pop("$defs", {})
    return _strict(raw, defs)


def _strict(node: Any, defs: Mapping[str, Any]) -> Any:
    if isinstance(node, list):
        return [_strict(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        return _strict(defs[node["$ref"].rsplit("/", 1)[-1]], defs)
    out = {
        k: _strict(v, defs)
        for k, v in node.items()
        if k not in _DROPPED_KEYWORDS and k != "properties"
    }  # property names kept as-is below
    if "properties" in node:
        out["properties"] = {name: _strict(sub, defs) for name, sub in node["properties"].items()}
    if out.get("type") == "object":
        out["additionalProperties"] = False
        out["required"] = list(out.get("properties", {}))
    return out
