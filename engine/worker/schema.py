"""The OpenAI chat-completions wire format: parsing requests, shaping responses.

Contract: :func:`parse_chat_request` turns a decoded JSON body into a
:class:`ChatRequest` or raises :class:`FieldError` (a :class:`BadRequestError` naming
the offending ``param``). The ``*_json`` functions build plain dicts for
``chat.completion``, ``chat.completion.chunk`` and OpenAI's error object. Extensions:
a request may carry ``speculation`` (``method``, ``num_draft_tokens``) and ``top_k``;
a response carries ``speculation`` (what the answer measured) and chunks carry
``anve.pieces``: ``[[text, from_draft], ...]``, telling which text came from accepted
draft tokens (streamed chunks also carry ``anve.tokens``, ``anve.drafted`` and
``anve.accepted``, the tokens, drafts and accepted drafts of that pass; the
final chunk and the non-streamed answer carry ``anve.token_ids``, the answer's token ids,
so clients can check two answers are identical token for token). Before its first text, a
streamed answer may get chunks with an empty delta and ``anve.queue`` (``{ahead}``: answers
served before it) or ``anve.prompt_progress`` (``{read, total}`` prompt tokens).

A request may also carry ``anve.context_overflow``: ``"stop"`` (the default: a
conversation longer than the context is refused with ``context_length_exceeded``) or
``"rolling_window"`` (its oldest turns are left out; the system prompt and the latest
turn are kept); when messages were left out, a chunk with an empty delta and the final
chunk (or the whole answer) carry ``anve.context_window``: ``{dropped_messages,
prompt_tokens}``. ``continue_final_message: true`` with ``add_generation_prompt: false``
(vLLM's fields) continues the last message, the assistant's partial answer; only the
new text comes back. The first streamed chunk carries ``anve.method``, the drafting
method the answer runs with (``off``: plain decoding).

``anve.cache`` says how the answer may use what the worker kept from earlier answers:
``"warm"`` (the default) reuses the longest cached prefix of the prompt (the current KV
cache or a parked conversation's, the target's and the drafters' alike) and lets the
suffix lookup remember the answer; ``"cold"`` answers as if none of it were there: the
whole prompt is read (``usage.prompt_tokens_details.cached_tokens`` is 0), the suffix
lookup drafts only from the office's earlier answers and does not learn this one, and
the caches kept for the office's conversations stay as they were. The speed demo asks
cold for both its runs, so they start from the same state. A cold answer's final chunk
(or the whole answer) carries ``anve.cache: "cold"``. Any other value is a 400 with
``param`` ``anve.cache``.

A finished answer's ``speculation`` also carries ``total_s``: the seconds from when the
engine took the request to its last token, prompt reading included (with
``time_to_first_token_s``, the time after the first token).
Unknown request fields are ignored, as OpenAI-compatible servers do.
"""

import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.errors import BadRequestError
from engine.protocol import (
    CACHE_STATES,
    CONTEXT_OVERFLOW,
    STOP_AT_LIMIT,
    WARM,
    SpeculationStats,
)
from engine.spec.sampling import SamplingParams
from engine.spec.session import validate_messages
from engine.worker.settings import Decision, DraftLength, Override, parse_override

DEFAULT_MAX_TOKENS = 512
MAX_STOP_STRINGS = 16
MAX_SEED = 2**63 - 1
SPECULATION_FIELDS = (
    "passes", "drafted", "accepted", "acceptance_rate", "mean_accepted_length",
    "accepted_per_position", "tokens_per_second", "time_to_first_token_s", "total_s",
)
# reported when the engine gives them: passes run plain because drafting did not pay, and
# whether auto ran a runner-up once to time it (SpeculationStats.trial)
OPTIONAL_FIELDS = ("auto_off_passes", "trial")


class FieldError(BadRequestError):
    """A request field with the wrong type or value; ``param`` names it."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class ChatRequest:
    """A validated chat-completions request."""

    messages: list[dict[str, str]]
    params: SamplingParams
    max_tokens: int = DEFAULT_MAX_TOKENS
    stop: tuple[str, ...] = ()
    stream: bool = False
    speculation: Override | None = None
    context_overflow: str = STOP_AT_LIMIT
    continue_final: bool = False  # continue the last message (an assistant's answer)
    cache: str = WARM  # anve.cache: "warm" or "cold"


# --- parsing ---------------------------------------------------------------------


def _number(body: Mapping[str, Any], name: str, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FieldError(name, f"{name} must be a number, got {value!r}")
    return float(value)


def _integer(body: Mapping[str, Any], name: str, default: int | None, low: int) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise FieldError(name, f"{name} must be an integer of at least {low}, got {value!r}")
    return value


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if (
        isinstance(value, list)
        and len(value) <= MAX_STOP_STRINGS
        and all(isinstance(s, str) for s in value)
    ):
        return tuple(value)
    raise FieldError(
        "stop", f"stop must be a string or a list of at most {MAX_STOP_STRINGS} strings"
    )


def _text_content(content: Any) -> Any:
    """Join OpenAI's ``[{"type": "text", "text": ...}]`` content parts into one string."""
    if isinstance(content, list) and all(
        isinstance(p, Mapping) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in content
    ):
        return "".join(p["text"] for p in content)
    return content


def _messages(value: Any, continue_final: bool) -> list[dict[str, str]]:
    if value is None:
        raise FieldError("messages", "messages is required: a list of {role, content} objects")
    if isinstance(value, list):
        value = [
            {**m, "content": _text_content(m.get("content"))} if isinstance(m, Mapping) else m
            for m in value
        ]
    try:
        return validate_messages(value, continue_final)
    except BadRequestError as exc:
        raise FieldError("messages", str(exc)) from None


def _sampling(body: Mapping[str, Any]) -> SamplingParams:
    seed = _integer(body, "seed", None, 0)
    if seed is not None and seed > MAX_SEED:
        raise FieldError("seed", f"seed must be at most {MAX_SEED}")
    temperature = _number(body, "temperature", 1.0)
    top_p = _number(body, "top_p", 1.0)
    top_k = _integer(body, "top_k", 0, 0) or 0
    try:
        return SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
    except BadRequestError as exc:  # its messages start with the field's name
        raise FieldError(str(exc).split(" ", 1)[0], str(exc)) from None


def _flag(body: Mapping[str, Any], name: str, default: bool = False) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise FieldError(name, f"{name} must be true or false, got {value!r}")
    return value


def _continue_final(body: Mapping[str, Any]) -> bool:
    """vLLM's ``continue_final_message`` / ``add_generation_prompt`` pair."""
    continue_final = _flag(body, "continue_final_message")
    generation_prompt = _flag(body, "add_generation_prompt", True)
    if continue_final and generation_prompt:
        raise FieldError("add_generation_prompt", "continue_final_message needs "
                         "add_generation_prompt set to false (the answer is continued, "
                         "not started)")
    if not continue_final and not generation_prompt:
        raise FieldError("add_generation_prompt", "add_generation_prompt false is only "
                         "supported with continue_final_message true")
    return continue_final


def _anve(value: Any) -> Mapping[str, Any]:
    """A request's ``anve`` object (empty when absent)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise FieldError("anve", "anve must be an object, e.g. {\"context_overflow\": "
                         "\"rolling_window\"}")
    return value


def _one_of(anve: Mapping[str, Any], name: str, choices: Sequence[str], default: str) -> str:
    """``anve.<name>``: one of ``choices`` (``anve.context_overflow``, ``anve.cache``: see
    the module), ``default`` when absent."""
    value = anve.get(name, default)
    if value not in choices:
        raise FieldError(f"anve.{name}", f"anve.{name} must be one of {', '.join(choices)}, "
                         f"got {value!r}")
    return str(value)


def parse_chat_request(
    body: Any, methods: Sequence[str], adaptive: bool = False
) -> ChatRequest:
    """Validate a decoded ``POST /v1/chat/completions`` body.

    ``methods`` are the loaded drafting methods; ``adaptive`` says whether the engine
    accepts ``speculation.num_draft_tokens = "adaptive"``.
    """
    if not isinstance(body, Mapping):
        raise FieldError("body", "the request body must be a JSON object")
    n = body.get("n")
    if n not in (None, 1):
        raise FieldError("n", "only n = 1 is supported")
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    max_tokens = _integer({"max_tokens": limit}, "max_tokens", DEFAULT_MAX_TOKENS, 1)
    try:
        speculation = parse_override(body.get("speculation"), methods, adaptive)
    except BadRequestError as exc:
        raise FieldError("speculation", str(exc)) from None
    continue_final = _continue_final(body)
    anve = _anve(body.get("anve"))
    return ChatRequest(
        messages=_messages(body.get("messages"), continue_final),
        params=_sampling(body),
        max_tokens=max_tokens or DEFAULT_MAX_TOKENS,
        stop=_stop(body.get("stop")),
        stream=_flag(body, "stream"),
        speculation=speculation,
        context_overflow=_one_of(anve, "context_overflow", CONTEXT_OVERFLOW, STOP_AT_LIMIT),
        continue_final=continue_final,
        cache=_one_of(anve, "cache", CACHE_STATES, WARM),
    )


# --- responses ---------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """Identity shared by every chunk of one answer."""

    model: str
    id: str = field(default_factory=lambda: f"chatcmpl-{uuid.uuid4().hex}")
    created: int = field(default_factory=lambda: int(time.time()))


def pieces_json(pieces: Sequence[tuple[str, bool]]) -> dict[str, Any]:
    return {"pieces": [[text, from_draft] for text, from_draft in pieces]}


def usage_json(stats: SpeculationStats) -> dict[str, Any]:
    """OpenAI's usage object, with the prompt tokens served from the KV cache."""
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.completion_tokens,
        "total_tokens": stats.prompt_tokens + stats.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": stats.cached_tokens},
    }


def speculation_json(
    stats: SpeculationStats, decision: Decision, num_draft_tokens: DraftLength | None
) -> dict[str, Any]:
    """The ``speculation`` extension object of a finished answer."""
    measured = stats.to_dict()
    return {
        "method": stats.method,
        "enabled": stats.enabled,
        "disabled_reason": decision.disabled_reason,
        "num_draft_tokens": num_draft_tokens if stats.enabled else None,
        **{name: measured[name] for name in SPECULATION_FIELDS},
        **{name: measured[name] for name in OPTIONAL_FIELDS if name in measured},
    }


def chunk_json(
    answer: Answer, delta: dict[str, Any], finish_reason: str | None = None, **extra: Any
) -> dict[str, Any]:
    """One ``chat.completion.chunk``; ``extra`` adds top-level fields (usage, anve...)."""
    return {
        "id": answer.id, "object": "chat.completion.chunk", "created": answer.created,
        "model": answer.model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason,
                     "logprobs": None}],
        **extra,
    }


def completion_json(answer: Answer, text: str, finish_reason: str, **extra: Any) -> dict[str, Any]:
    """A whole ``chat.completion``; ``extra`` adds top-level fields."""
    return {
        "id": answer.id, "object": "chat.completion", "created": answer.created,
        "model": answer.model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                     "finish_reason": finish_reason, "logprobs": None}],
        **extra,
    }


ERROR_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 405: "invalid_request_error", 413: "invalid_request_error",
    429: "rate_limit_error",
}


def error_json(status: int, message: str, code: str, param: str | None = None) -> dict[str, Any]:
    kind = ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "code": code, "param": param}}
