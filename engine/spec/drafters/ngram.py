"""Prompt lookup: draft by copying what followed the context's last n-gram before.

The longest suffix n-gram of the context (``n`` from ``max_n`` down to ``min_n``) is
searched for earlier in the context; the tokens that followed its most recent earlier
occurrence are proposed. Drafts are deterministic, so ``q`` is one-hot (``probs=None``).

Example: context ``[1, 2, 3, 4, 2, 3]`` with ``min_n=1``, ``max_n=2`` finds ``[2, 3]``
at position 1 and proposes ``[4, 2, 3]`` (for ``k=3``).
"""

from collections.abc import Sequence

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view

from engine.spec.drafters import EMPTY_DRAFT, Draft, Drafter
from engine.spec.sampling import SamplingParams


def ngram_lookup(context: np.ndarray, k: int, min_n: int = 2, max_n: int = 4) -> list[int]:
    """Continuation of the most recent earlier match of the longest suffix n-gram."""
    length = len(context)
    if k <= 0:
        return []
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        # Windows start at 0 .. length-1-n: each is followed by at least one token,
        # and the suffix itself (start length-n) is excluded.
        windows = sliding_window_view(context[: length - 1], n)  # [length-n, n]
        hits = np.flatnonzero((windows == context[length - n :]).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return [int(t) for t in context[start : start + k]]
    return []


class NgramDrafter(Drafter):
    """Prompt-lookup drafter over the current conversation's own tokens."""

    name = "ngram"

    def __init__(self, min_n: int = 2, max_n: int = 4) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.min_n, self.max_n = min_n, max_n

    def propose(
        self, context: Sequence[int], k: int, params: SamplingParams, generator: torch.Generator
    ) -> Draft:
        del params, generator
        tokens = ngram_lookup(np.asarray(context, dtype=np.int64), k, self.min_n, self.max_n)
        return Draft(tuple(tokens)) if tokens else EMPTY_DRAFT

