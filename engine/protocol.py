"""Plain data shared by the engine, the worker and the desktop app.

Frozen dataclasses only: no torch, no Qt. The app may import this module (and only
this module of the engine) to speak the worker's language.
"""

from dataclasses import asdict, dataclass, field
from typing import Any

PROTOCOL_VERSION = 1

METHODS = ("draft", "ngram", "suffix", "hybrid", "eagle", "hybrid-eagle", "off")
"""Drafting methods by name; ``off`` is plain decoding."""

ACCELERATIONS = ("auto", "off", "fp32", "int4", "int4+int8")
"""Linear-layer kernels (:mod:`engine.cpu.quantize` modes); ``auto`` picks per model."""

ROLLING_WINDOW, STOP_AT_LIMIT = "rolling_window", "stop"
CONTEXT_OVERFLOW = (ROLLING_WINDOW, STOP_AT_LIMIT)
"""What to do when a conversation outgrows the model's context: leave out its oldest
turns (the system prompt and the latest turn are always kept), or refuse it with a
``context_length_exceeded`` error."""

WARM, COLD = "warm", "cold"
CACHE_STATES = (WARM, COLD)
"""How an answer may use what the engine kept from earlier answers: ``warm`` reuses
cached prompts and drafters' caches and lets the suffix lookup remember the answer;
``cold`` reads the prompt as if nothing were cached and leaves no trace (the speed
demo's two runs start from the same state this way)."""


@dataclass(frozen=True)
class SpeculationStats:
    """What one answer measured. Rates are ``None`` when nothing was drafted."""

    method: str
    enabled: bool
    prompt_tokens: int = 0
    cached_tokens: int = 0  # of the prompt, found in the KV cache (not processed again)
    completion_tokens: int = 0
    passes: int = 0  # target forward passes after the prompt
    drafted: int = 0
    accepted: int = 0
    accepted_per_position: tuple[int, ...] = ()  # passes whose i-th draft was accepted
    prefill_s: float = 0.0  # the target's reading of the prompt + the drafter's (after token 1)
    draft_s: float = 0.0
    verify_s: float = 0.0
    total_s: float = 0.0
    time_to_first_token_s: float | None = None
    adaptive: bool = False  # draft length chosen per pass from measured costs
    auto_off_passes: int = 0  # passes run plain because drafting was measured not to pay
    # auto ran a runner-up predicted close to the best but not yet timed on this machine
    trial: bool = False

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def mean_accepted_length(self) -> float | None:
        """Tokens per target pass, the bonus or corrected token included (vLLM's)."""
        return (self.accepted + self.passes) / self.passes if self.passes else None

    @property
    def tokens_per_second(self) -> float | None:
        decode_s = self.total_s - self.prefill_s
        return self.completion_tokens / decode_s if decode_s > 0 else None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["accepted_per_position"] = list(self.accepted_per_position)
        out["acceptance_rate"] = self.acceptance_rate
        out["mean_accepted_length"] = self.mean_accepted_length
        out["tokens_per_second"] = self.tokens_per_second
        return out


@dataclass(frozen=True)
class TextChunk:
    """New answer text; ``pieces`` split it by whether it came from accepted drafts."""

    text: str
    pieces: tuple[tuple[str, bool], ...] = ()
    token_ids: tuple[int, ...] = ()
    drafted: int = 0  # draft tokens proposed in the pass(es) that produced this chunk
    accepted: int = 0  # of those, accepted by the target


@dataclass(frozen=True)
class PromptProgress:
    """The target has read ``read`` of the ``total`` prompt tokens it had to read for this
    answer (those not already in its cache); sent before the first token of a long prompt."""

    read: int
    total: int


@dataclass(frozen=True)
class ContextWindow:
    """The conversation did not fit the model's context: its ``dropped_messages`` oldest
    messages (after the system prompt) were left out, leaving ``prompt_tokens``. Sent
    first, and only when something was left out."""

    dropped_messages: int
    prompt_tokens: int


@dataclass(frozen=True)
class Completion:
    """The end of an answer: all its text, why it ended, and its statistics."""

    text: str
    finish_reason: str  # "stop", "length" or "cancelled"
    token_ids: tuple[int, ...]
    stats: SpeculationStats
    extra: dict[str, Any] = field(default_factory=dict)
