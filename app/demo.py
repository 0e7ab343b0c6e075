"""The side-by-side speed demo's arithmetic: comparison, speedups, replay. No Qt here.

Contract: :func:`compare` says whether the plain and the speculative answer are the
same, and where they first differ (a character index with a short excerpt of each);
:func:`text_at` replays a measured timeline (``(seconds, new text)`` per chunk): the
text shown ``t`` seconds after the request; :func:`speedup` is the ratio of two speeds.
:func:`timing` reads a side's measured times (the worker's ``total_s`` and time to first
token, else its timeline's), :func:`speedups` compares two sides end to end and after
the first token (tokens per second, so the ratio of times when both answers have as many
tokens), and :func:`speed_text`, :func:`method_text` and :func:`start_text` say in words
what was measured, which method ran and whether both runs started from the same cache
state (:data:`COLD`: the demo asks the worker for cold runs). :func:`load_prompts` reads
the shipped demo prompts.
"""

import bisect
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.answer import AnswerStats, method_name
from engine.protocol import COLD

EXCERPT = 24
# methods that draft from the office's earlier answers
LOOKUPS = ("suffix", "hybrid", "hybrid-eagle")


@dataclass(frozen=True)
class DemoPrompt:
    kind: str  # "code", "summary" or "chat"
    title: str
    prompt: str


@dataclass(frozen=True)
class Comparison:
    identical: bool
    index: int | None  # first differing character, None when identical
    plain_excerpt: str = ""
    speculative_excerpt: str = ""

    def describe(self) -> str:
        if self.identical:
            return "Identical output: both answers match token for token."
        return (
            f"Outputs differ from character {self.index}: plain “{self.plain_excerpt}” "
            f"vs speculative “{self.speculative_excerpt}”"
        )


def first_difference(a: str, b: str) -> int | None:
    """Index of the first character where ``a`` and ``b`` differ (None if equal)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare(
    plain: str, speculative: str, plain_tokens: int | None = None,
    speculative_tokens: int | None = None,
    plain_ids: Sequence[int] | None = None, speculative_ids: Sequence[int] | None = None,
) -> Comparison:
    """Identical token ids when the worker sent them; else same text and token count."""
    index = first_difference(plain, speculative)
    if plain_ids is not None and speculative_ids is not None:
        if list(plain_ids) == list(speculative_ids):
            return Comparison(True, None)
        index = len(plain) if index is None else index  # same text from different tokens
    counted = plain_tokens is not None and speculative_tokens is not None
    if index is None and counted and plain_tokens != speculative_tokens:
        index = len(plain)
    if index is None:
        return Comparison(True, None)
    return Comparison(
        False, index, plain[index : index + EXCERPT], speculative[index : index + EXCERPT]
    )


def text_at(timeline: Sequence[Sequence[Any]], t: float) -> str:
    """The text a replay shows ``t`` seconds after the request started."""
    times = [float(at) for at, _ in timeline]
    shown = bisect.bisect_right(times, t)
    return "".join(str(text) for _, text in timeline[:shown])


def duration(timeline: Sequence[Sequence[Any]]) -> float:
    return float(timeline[-1][0]) if timeline else 0.0


def speedup(plain_tps: float | None, speculative_tps: float | None) -> float | None:
    """How many times faster the speculative answer decoded."""
    if not plain_tps or not speculative_tps:
        return None
    return speculative_tps / plain_tps


@dataclass(frozen=True)
class Timing:
    """One side's answer: its tokens, and when its first and last token came (seconds
    after the request)."""

    tokens: int
    first_token_s: float | None
    total_s: float | None

    @property
    def rate(self) -> float | None:
        """Tokens per second, end to end (prompt reading included)."""
        if self.tokens < 1 or not self.total_s or self.total_s <= 0:
            return None
        return self.tokens / self.total_s

    @property
    def rate_after_first(self) -> float | None:
        """Tokens per second after the first token (generation only)."""
        if self.tokens < 2 or self.total_s is None or self.first_token_s is None:
            return None
        after = self.total_s - self.first_token_s
        return (self.tokens - 1) / after if after > 0 else None


@dataclass(frozen=True)
class Speedups:
    """How many times faster the speculative side was (``None``: not measured)."""

    total: float | None  # end to end
    after_first: float | None  # after the first token


def timing(stats: AnswerStats, timeline: Sequence[Sequence[Any]] = ()) -> Timing:
    """A side's times: the worker's (``total_s``, ``time_to_first_token_s``), else those
    its timeline recorded (a run saved before the worker reported ``total_s``)."""
    if stats.total_s is not None:
        return Timing(stats.completion_tokens, stats.time_to_first_token_s, stats.total_s)
    first = float(timeline[0][0]) if timeline else None
    return Timing(stats.completion_tokens, first, duration(timeline) if timeline else None)


def side_stats(side: Mapping[str, Any]) -> tuple[AnswerStats, Timing]:
    """A stored side's (``{text, stats, timeline}``) stats and times."""
    stats = AnswerStats.from_dict(side.get("stats")) or AnswerStats()
    return stats, timing(stats, side.get("timeline") or ())


def speedups(plain: Timing, fast: Timing) -> Speedups:
    return Speedups(speedup(plain.rate, fast.rate),
                    speedup(plain.rate_after_first, fast.rate_after_first))


def _seconds(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f} s"


def speed_text(plain: Timing, fast: Timing) -> str:
    """One line: the ratio after the first token and each side's time to first token."""
    after = speedups(plain, fast).after_first
    parts = [f"{after:.2f}× after the first token" if after else
             "after the first token: not measured"]
    parts.append(f"first token {_seconds(plain.first_token_s)} plain, "
                 f"{_seconds(fast.first_token_s)} speculative")
    return " · ".join(parts)


def method_text(fast: AnswerStats, asked: str) -> str:
    """Which method the speculative side ran (the worker's ``speculation.method``)."""
    if fast.method in ("unknown", ""):
        return f"Method asked for: {method_name(asked)}"
    if not fast.enabled:
        why = " (the appliance was busy)" if fast.disabled_reason == "load" else ""
        return f"Speculation was off for this run{why}: both sides ran plain decoding"
    return f"Method: {method_name(fast.method)}"


def start_text(plain: AnswerStats, fast: AnswerStats) -> tuple[str, bool]:
    """Whether both runs started from the same cache state, in words, and whether they
    did (``False``: the comparison is not like for like)."""
    if plain.cache == COLD and fast.cache == COLD:
        text = ("Both runs started cold: each read the whole prompt, and the speculative "
                "run did not draft from the plain run's answer.")
        if fast.method in LOOKUPS:
            text += " Suffix lookup drafted from the office's earlier answers only."
        return text, True
    if plain.cached_tokens == fast.cached_tokens:
        n = plain.cached_tokens
        text = f"Both runs found the same {n} prompt token{'' if n == 1 else 's'} cached."
        if fast.method in LOOKUPS:
            return text + " Suffix lookup may have drafted from the plain run's answer.", False
        return text, True
    return (f"Not a like-for-like start: {fast.cached_tokens} prompt tokens were cached for "
            f"the speculative run, {plain.cached_tokens} for the plain run.", False)


def load_prompts(path: Path) -> list[DemoPrompt]:
    data = json.loads(path.read_text(encoding="utf-8"))
    return [DemoPrompt(p["kind"], p["title"], p["prompt"]) for p in data["prompts"]]
