"""One streamed answer: its text, draft pieces, timeline and statistics. No Qt here.

Contract: :class:`AnswerStream` takes the worker's SSE payloads (``chat.completion.chunk``
objects, see ``engine/worker/schema.py``) in order with the time they arrived and keeps

* ``text`` and ``pieces`` (``[[text, from_draft], ...]``, neighbours merged),
* ``timeline``: ``(seconds since the request, new text)`` per chunk, for the demo replay,
* live estimates (:meth:`AnswerStream.live_stats`): tokens, tokens/s, time to first
  token, tokens per target pass and accepted drafts per position, counted from the
  chunks (one chunk per target pass; ``anve.tokens`` counts its tokens),
* before the first token, how many answers the worker serves before this one
  (``anve.queue``) and how much of a long prompt it has read (``anve.prompt_progress``);
  :func:`waiting_text` says it under the answer,
* the drafting method the worker runs the answer with (``anve.method`` of the first
  chunk; the footer names it from the first token on, never "unknown") and how many
  earlier messages a rolling context window left out (``anve.context_window``),
* the worker's measured :class:`AnswerStats` once the final chunk arrives (with the
  answer's end-to-end ``total_s`` and, for a cold answer, ``cache = "cold"``),
* and, from any OpenAI-compatible server, the finish reason, ``usage`` and llama.cpp's
  ``timings`` (the client maps them with :mod:`app.engines`).

Rates the worker did not measure are ``None``; ``estimated`` marks numbers the app
counted itself (while streaming, or for an answer stopped before its final chunk).
"""

from dataclasses import asdict, dataclass, field, replace
from typing import Any

METHOD_NAMES = {
    "draft": "draft model", "ngram": "n-gram lookup", "suffix": "suffix lookup",
    "hybrid": "lookup, else draft model",
    "eagle": "EAGLE head", "hybrid-eagle": "lookup, else EAGLE head", "off": "plain decoding",
}


ENGINE_LABELS = {"vllm": "vLLM", "llama.cpp": "llama.cpp", "openai": "other server"}


def method_name(method: str | None) -> str:
    """The method in words (a newer worker's by its name); none is just speculation."""
    if not method or method == "unknown":
        return "speculative decoding"
    return METHOD_NAMES.get(method, method)


@dataclass(frozen=True)
class AnswerStats:
    """What an answer measured (the worker's ``speculation`` object plus usage)."""

    method: str = "unknown"
    enabled: bool = False
    disabled_reason: str | None = None
    num_draft_tokens: int | str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0  # of the prompt, reused from the worker's KV cache
    completion_tokens: int = 0
    passes: int = 0
    drafted: int = 0
    accepted: int = 0
    acceptance_rate: float | None = None
    mean_accepted_length: float | None = None
    accepted_per_position: tuple[int, ...] = ()
    tokens_per_second: float | None = None
    time_to_first_token_s: float | None = None
    total_s: float | None = None  # the worker's time from the request to the last token
    finish_reason: str | None = None
    estimated: bool = False
    token_ids: tuple[int, ...] | None = None  # the answer's token ids, when the worker sent them
    engine: str = "anve"  # the server that answered (app.engines: anve, vllm, llama.cpp, openai)
    unreported: tuple[str, ...] = ()  # panel figures that server does not report
    notes: tuple[str, ...] = ()  # what the figures mean there (shared server, reset, ...)
    prompt_read: int = 0  # while a long prompt is read: its tokens read so far,
    prompt_to_read: int = 0  # of these (the part not cached); 0 when not reported
    queue_ahead: int = 0  # while the answer waits its turn: answers before it
    dropped_messages: int = 0  # earlier messages a rolling context window left out
    cache: str | None = None  # "cold" when the worker confirmed it reused no cache

    @classmethod
    def from_final_chunk(cls, chunk: dict[str, Any]) -> "AnswerStats":
        spec = chunk.get("speculation") or {}
        usage = chunk.get("usage") or {}
        choices = chunk.get("choices") or [{}]
        anve = chunk.get("anve") or {}
        ids = anve.get("token_ids")
        return cls(
            method=str(spec.get("method", "unknown")),
            enabled=bool(spec.get("enabled", False)),
            disabled_reason=spec.get("disabled_reason"),
            num_draft_tokens=spec.get("num_draft_tokens"),
            prompt_tokens=int(usage.get("prompt_tokens", 0)),
            cached_tokens=int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens", 0)),
            passes=int(spec.get("passes", 0)),
            drafted=int(spec.get("drafted", 0)),
            accepted=int(spec.get("accepted", 0)),
            acceptance_rate=spec.get("acceptance_rate"),
            mean_accepted_length=spec.get("mean_accepted_length"),
            accepted_per_position=tuple(spec.get("accepted_per_position") or ()),
            tokens_per_second=spec.get("tokens_per_second"),
            time_to_first_token_s=spec.get("time_to_first_token_s"),
            total_s=spec.get("total_s"),
            finish_reason=choices[0].get("finish_reason"),
            token_ids=None if ids is None else tuple(int(t) for t in ids),
            dropped_messages=dropped_messages(anve.get("context_window")),
            cache=anve["cache"] if isinstance(anve.get("cache"), str) else None,
        )

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["accepted_per_position"] = list(self.accepted_per_position)
        out["token_ids"] = None if self.token_ids is None else list(self.token_ids)
        out["unreported"], out["notes"] = list(self.unreported), list(self.notes)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> "AnswerStats | None":
        if not data:
            return None
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        known["accepted_per_position"] = tuple(known.get("accepted_per_position") or ())
        if known.get("token_ids") is not None:
            known["token_ids"] = tuple(known["token_ids"])
        for name in ("unreported", "notes"):
            known[name] = tuple(known.get(name) or ())
        return cls(**known)

    @property
    def position_rates(self) -> list[float]:
        """Share of target passes whose i-th draft token was accepted."""
        if not self.passes:
            return []
        return [n / self.passes for n in self.accepted_per_position]


def dropped_messages(window: Any) -> int:
    """``anve.context_window.dropped_messages`` (0 when absent or ill-formed)."""
    n = window.get("dropped_messages") if isinstance(window, dict) else None
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 0


def stored_stats(stored: dict[str, Any] | None) -> AnswerStats | None:
    """The measured stats inside a message's stored stats ``{"measured", "outcome", "note"}``."""
    return AnswerStats.from_dict((stored or {}).get("measured"))


def waiting_text(stats: AnswerStats) -> str:
    """What an answer with no token yet is doing: waiting its turn, reading a long prompt,
    or starting."""
    if stats.queue_ahead:
        n = stats.queue_ahead
        return f"Waiting for the appliance: {n} answer{'s' if n > 1 else ''} ahead of this one"
    if stats.prompt_to_read:
        share = stats.prompt_read / stats.prompt_to_read
        return f"Reading the prompt… {share:.0%} of {stats.prompt_to_read:,} tokens"
    return "Answering…"


def footer_text(stats: AnswerStats) -> str:
    """One line under an answer: tokens · tok/s · first token · method · acceptance (or,
    while it streams with no token yet, :func:`waiting_text`)."""
    if stats.estimated and not stats.completion_tokens and stats.finish_reason is None:
        return waiting_text(stats)
    n = stats.completion_tokens
    parts = [f"{n} token{'' if n == 1 else 's'}"]
    if stats.tokens_per_second is not None:
        parts.append(f"{stats.tokens_per_second:.1f} tok/s")
    if stats.time_to_first_token_s is not None:
        parts.append(f"first token {stats.time_to_first_token_s:.2f} s")
    if 2 * stats.cached_tokens > stats.prompt_tokens:  # a conversation's history, not a header
        parts.append(f"prompt {stats.cached_tokens / stats.prompt_tokens:.0%} cached")
    if stats.engine != "anve":
        label = ENGINE_LABELS.get(stats.engine, stats.engine)
        parts.append(f"{label} speculation" if stats.enabled else label)
    elif stats.enabled:
        parts.append(method_name(stats.method))
    elif stats.disabled_reason == "load":
        parts.append("speculation off: high load")
    else:
        parts.append("plain decoding")
    if stats.acceptance_rate is not None:
        parts.append(f"{stats.acceptance_rate:.0%} accepted")
    if stats.mean_accepted_length is not None:
        parts.append(f"{stats.mean_accepted_length:.2f} tokens/pass")
    if any(note.startswith("shared server") for note in stats.notes):
        parts.append("shared server")
    text = " · ".join(parts)
    return f"≈ {text}" if stats.estimated else text


def merge_pieces(pieces: list[list[Any]], new: list[list[Any]]) -> None:
    """Append ``new`` pieces to ``pieces``, joining neighbours with the same flag."""
    for text, flag in new:
        if not text:
            continue
        if pieces and bool(pieces[-1][1]) == bool(flag):
            pieces[-1][0] += text
        else:
            pieces.append([text, bool(flag)])


@dataclass
class AnswerStream:
    """Accumulates one streamed answer; times are ``loop.time()`` seconds."""

    started: float
    text: str = ""
    pieces: list[list[Any]] = field(default_factory=list)
    timeline: list[tuple[float, str]] = field(default_factory=list)
    tokens: int = 0
    passes: int = 0
    drafted: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    first_token_at: float | None = None
    last_token_at: float | None = None
    final: AnswerStats | None = None
    model: str = ""
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None  # llama.cpp's per-response timings
    prompt_read: int = 0  # the worker's last anve.prompt_progress: tokens read so far,
    prompt_to_read: int = 0  # of these
    queue_ahead: int = 0  # the worker's last anve.queue: answers before this one
    method: str | None = None  # the worker's anve.method: what the answer runs with
    dropped_messages: int = 0  # the worker's anve.context_window: messages left out

    def add(self, chunk: dict[str, Any], now: float) -> None:
        """Take one SSE payload that arrived at ``now``."""
        self.model = chunk.get("model", self.model)
        choices = chunk.get("choices") or [{}]
        delta = choices[0].get("delta") or {}
        if chunk.get("speculation") is not None or chunk.get("usage") is not None:
            self.final = AnswerStats.from_final_chunk(chunk)
        if choices[0].get("finish_reason"):
            self.finish_reason = str(choices[0]["finish_reason"])
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        if isinstance(chunk.get("timings"), dict):
            self.timings = chunk["timings"]
        anve = chunk.get("anve") or {}
        self._take_status(anve)
        content = delta.get("content") or ""
        if not content:
            return
        pieces = anve.get("pieces") or [[content, False]]
        n = int(anve.get("tokens") or 1)
        accepted = anve.get("accepted")
        if accepted is None:  # an older worker: infer from the draft flags
            accepted = n - 1 if any(flag for _, flag in pieces) else 0
        self.drafted += int(anve.get("drafted") or 0)
        self._count_pass(n, int(accepted))
        self.text += content
        merge_pieces(self.pieces, pieces)
        self.timeline.append((now - self.started, content))
        if self.first_token_at is None:
            self.first_token_at = now
        self.last_token_at = now

    def _take_status(self, anve: dict[str, Any]) -> None:
        """Take the worker's ``queue: {ahead}``, ``prompt_progress: {read, total}``,
        ``method`` and ``context_window`` (ill-formed figures are ignored)."""
        if isinstance(anve.get("method"), str) and anve["method"]:
            self.method = anve["method"]
        self.dropped_messages = (dropped_messages(anve.get("context_window"))
                                 or self.dropped_messages)
        queue, progress = anve.get("queue"), anve.get("prompt_progress")
        if isinstance(queue, dict) and isinstance(queue.get("ahead"), int) and queue["ahead"] >= 0:
            self.queue_ahead = queue["ahead"]
        if not isinstance(progress, dict):
            return
        read, total = progress.get("read"), progress.get("total")
        if isinstance(read, int) and isinstance(total, int) and 0 <= read <= total:
            self.prompt_read, self.prompt_to_read = read, total

    def _count_pass(self, tokens: int, accepted: int) -> None:
        self.tokens += tokens
        self.passes += 1
        while len(self.accepted_per_position) < accepted:
            self.accepted_per_position.append(0)
        for i in range(accepted):
            self.accepted_per_position[i] += 1

    def live_stats(self, now: float) -> AnswerStats:
        """The app's own count so far (``estimated``)."""
        rate = None
        if self.first_token_at is not None and self.tokens > 1:
            elapsed = max(now, self.last_token_at or now) - self.first_token_at
            rate = (self.tokens - 1) / elapsed if elapsed > 0 else None
        ttft = None if self.first_token_at is None else self.first_token_at - self.started
        drafting = any(self.accepted_per_position)
        return AnswerStats(
            method=self.method or "unknown",
            enabled=drafting if self.method is None else self.method != "off",
            completion_tokens=self.tokens,
            passes=self.passes,
            drafted=self.drafted,
            accepted=sum(self.accepted_per_position),
            acceptance_rate=(
                sum(self.accepted_per_position) / self.drafted if self.drafted else None
            ),
            mean_accepted_length=self.tokens / self.passes if self.passes else None,
            accepted_per_position=tuple(self.accepted_per_position),
            tokens_per_second=rate,
            time_to_first_token_s=ttft,
            estimated=True,
            prompt_read=self.prompt_read,
            prompt_to_read=self.prompt_to_read,
            queue_ahead=self.queue_ahead,
            dropped_messages=self.dropped_messages,
        )

    def stats(self, now: float) -> AnswerStats:
        """The worker's numbers when it sent them, else the app's estimate."""
        if self.final is not None:
            return self.final
        return replace(self.live_stats(now), finish_reason="cancelled")
