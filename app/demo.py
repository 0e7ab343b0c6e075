"""The side-by-side speed demo's arithmetic: comparison, speedup, replay. No Qt here.

Contract: :func:`compare` says whether the plain and the speculative answer are the
same, and where they first differ (a character index with a short excerpt of each);
:func:`text_at` replays a measured timeline (``(seconds, new text)`` per chunk): the
text shown ``t`` seconds after the request; :func:`speedup` is the ratio of decoding
speeds the worker measured. :func:`load_prompts` reads the shipped demo prompts.
"""

import bisect
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EXCERPT = 24


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


def load_prompts(path: Path) -> list[DemoPrompt]:
    data = json.loads(path.read_text(encoding="utf-8"))
    return [DemoPrompt(p["kind"], p["title"], p["prompt"]) for p in data["prompts"]]
