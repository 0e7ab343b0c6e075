"""Pure sampling helpers: logits -> processed probabilities, and drawing tokens.

The same :func:`probabilities` is applied to the target's logits (``p``) and the
drafter's logits (``q``): speculative sampling is lossless only if both sides see the
identical temperature, top-k and top-p processing.

Seeded answers (``SamplingParams.seed``) draw the token at each position of the context
from one uniform number that depends only on the seed and that position
(:func:`position_uniform`), by inverting the distribution's cumulative sum in token-id
order (:func:`quantile_token`). Each token is then an exact sample of ``p`` (the
uniforms of different positions are independent), and the answer is a function of the
seed and the target's distributions alone: a draft changes how many tokens a pass
keeps, never which. So the same seed gives the same answer with or without speculation,
whichever method drafts and whatever length the policy picks from the machine's
timings.
"""

from dataclasses import dataclass

import torch

from engine.errors import BadRequestError


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens. ``temperature == 0`` means greedy (argmax)."""

    temperature: float = 0.0
    top_k: int = 0  # 0 = no top-k filtering
    top_p: float = 1.0  # 1 = no nucleus filtering
    seed: int | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.temperature <= 5.0:
            raise BadRequestError(f"temperature must be between 0 and 5, got {self.temperature}")
        if self.top_k < 0:
            raise BadRequestError(f"top_k must be 0 (off) or positive, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise BadRequestError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Processed next-token distribution for each row of ``logits``.

    Args:
        logits: ``[..., V]`` raw scores.
        params: temperature (> 0 here), top-k and top-p.
    Returns:
        ``[..., V]`` float probabilities summing to 1 on the last axis.
    """
    scores = logits.float() / params.temperature  # [..., V]
    if params.top_k and params.top_k < scores.shape[-1]:
        kth = torch.topk(scores, params.top_k, dim=-1).values[..., -1:]  # [..., 1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
        cum = sorted_scores.softmax(-1).cumsum(-1)  # [..., V]
        # Drop a token when the mass before it already reaches top_p (keep at least one).
        drop_sorted = (cum - sorted_scores.softmax(-1)) >= params.top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return scores.softmax(-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Draw one token id per row of ``probs`` (``[..., V]`` -> ``[...]``)."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])


_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15  # splitmix64's increment


def _mix64(x: int) -> int:
    """splitmix64's finaliser: a bijection of 64-bit integers that scrambles every bit."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK64
    return x ^ (x >> 31)


def position_uniform(seed: int, position: int) -> float:
    """The uniform number in ``(0, 1)`` that picks the token at ``position`` of a seeded
    answer: a pure function of the two (53 random bits, never exactly 0 or 1)."""
    x = _mix64((_mix64(seed & _MASK64) + (position + 1) * _GOLDEN) & _MASK64)
    return ((x >> 11) + 0.5) / float(1 << 53)


def quantile_token(probs: torch.Tensor, u: float) -> int:
    """The token whose cumulative-probability interval (token-id order) holds ``u``:
    an exact sample of ``probs`` ``[V]`` for ``u`` uniform, never a zero-probability
    token."""
    cum = probs.double().cumsum(-1)  # [V]
    at = torch.tensor([u * float(cum[-1])], dtype=torch.float64)
    index = int(torch.searchsorted(cum, at, right=True)[0])
    return min(index, int(probs.nonzero()[-1]))
