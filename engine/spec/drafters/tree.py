"""Branching a model drafter's chain into a small token tree (EAGLE-2 style, one pass).

A model drafter (draft model, EAGLE head) computes a distribution at every depth of its
chain anyway. :func:`choose` takes the chain's token from it and, on request, the next
likeliest alternatives: the top ones when greedy, drawn one after another without
replacement when sampling (what :func:`engine.spec.acceptance.tree_accept` needs to stay
lossless). :func:`branch` then keeps the chain and adds, as leaves beside it, the
alternatives whose estimated chance of being the target's token (the draft's confidence
in the path to their parent times their own) is highest, up to a budget. The tree costs
no extra drafter step, only extra rows in the one verification pass: worth it where the
draft is often nearly right, as a head with a low first-token acceptance is.
"""

from dataclasses import dataclass, field

import torch

from engine.spec.drafters import Draft
from engine.spec.sampling import (
    SamplingParams,
    position_uniform,
    probabilities,
    quantile_token,
    sample,
)


@dataclass
class Level:
    """One depth of a drafted chain: its token, the alternatives, their confidences."""

    token: int
    confidence: float
    q: torch.Tensor | None  # [V] the distribution the tokens were drawn from (sampling)
    alternatives: list[tuple[int, float]] = field(default_factory=list)


def choose(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator,
           alternatives: int = 0, position: int | None = None,
           ids: torch.Tensor | None = None) -> Level:
    """The chain's token at this depth from ``logits`` ``[V]`` and up to ``alternatives``
    others (greedy: the next likeliest; sampling: drawn without replacement).

    Greedy ``logits`` may cover only some ids, ``ids`` ``[N]`` (ascending), the rest being
    ``-inf`` (:func:`engine.spec.drafters.vocab.kept_logits`): the same tokens and, up to
    rounding, the same confidences. In a seeded answer, the token for context ``position``
    is drawn with the uniform the target will use there
    (:func:`engine.spec.sampling.position_uniform`): where the draft's distribution is close
    to the target's, the two pick the same token."""
    if params.greedy:
        probs = logits.float().softmax(-1)  # [V] or [N]
        top = probs.topk(1 + alternatives)
        tokens = top.indices if ids is None else ids[top.indices]
        pairs = [(int(t), float(c)) for c, t in zip(top.values, tokens, strict=True)]
        return Level(pairs[0][0], pairs[0][1], None, pairs[1:])
    if ids is not None:
        raise ValueError("sampling draws from the whole vocabulary's logits, not some ids'")
    q = probabilities(logits, params)  # [V]
    if params.seed is not None and position is not None:
        token = quantile_token(q, position_uniform(params.seed, position))
    else:
        token = int(sample(q, generator))
    level = Level(token, float(q[token]), q)
    left = q.clone()
    for _ in range(alternatives):
        left[level.alternatives[-1][0] if level.alternatives else token] = 0.0
        if float(left.sum()) <= 0.0:
            break
        other = int(sample(left / left.sum(), generator))
        level.alternatives.append((other, float(q[other])))
    return level


def branch(levels: list[Level], budget: int, min_chance: float) -> Draft:
    """The chain of ``levels`` plus at most ``budget`` alternatives as leaves, the likeliest
    first, each with a chance (path confidence) of at least ``min_chance``."""
    tokens = [level.token for level in levels]
    parents = list(range(-1, len(levels) - 1))
    rows = [level.q for level in levels]
    reach, candidates = 1.0, []  # (chance, depth, draw order, token)
    for depth, level in enumerate(levels):
        for order, (token, confidence) in enumerate(level.alternatives):
            candidates.append((reach * confidence, depth, order, token))
        reach *= level.confidence
    picked = sorted(c for c in candidates if c[0] >= min_chance)[::-1][:budget]
    for _, depth, _, token in sorted(picked, key=lambda c: (c[1], c[2])):
        tokens.append(token)
        parents.append(depth - 1)  # beside the chain's token at this depth
        rows.append(levels[depth].q)
    probs = None if not rows or rows[0] is None else torch.stack(rows)  # type: ignore[arg-type]
    return Draft(tuple(tokens), probs, tuple(parents) if picked else None)
