"""Suffix lookup over the office's earlier answers and the current conversation.

SuffixDecoding-style (Oliaro et al. 2024): the drafter keeps a corpus of earlier
token sequences (past answers supplied by the caller, plus every answer the engine
reports through ``add_document``) and, at each pass, finds the places where the
longest suffix of the current context (up to ``max_depth`` tokens) occurred before,
in that corpus and in the current context. From those places it walks forward,
taking at each step the token that most of them continue with, while the fraction of
places that agree along the path (its empirical probability) stays at least
``min_prob``. Repeated phrasing across conversations is drafted this way. Drafts are
deterministic, so ``q`` is one-hot (``probs=None``). With ``branches`` the runner-up
continuations become leaves beside the path (:mod:`engine.spec.drafters.tree`), their
chance the share of places that continue that way.
"""

from collections import Counter, defaultdict
from collections.abc import Sequence

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view

from engine.spec.drafters import EMPTY_DRAFT, Draft, Drafter
from engine.spec.drafters.tree import Level, branch
from engine.spec.sampling import SamplingParams

SEPARATOR = -1  # between documents in the corpus; never a token id


class SuffixIndex:
    """Documents concatenated with separators, indexed by their ``key_len``-grams."""

    def __init__(self, key_len: int = 2, max_tokens: int = 1_000_000) -> None:
        self.key_len = key_len
        self.max_tokens = max_tokens
        self.docs: list[list[int]] = []
        self._tokens: list[int] = []
        self._array: np.ndarray | None = None
        self._index: dict[tuple[int, ...], list[int]] = defaultdict(list)

    def __len__(self) -> int:
        return len(self._tokens)

    def add(self, doc: Sequence[int]) -> None:
        """Append one document; drop the oldest ones when over ``max_tokens``."""
        if len(doc) <= self.key_len:
            return
        self.docs.append([int(t) for t in doc])
        self._append(self.docs[-1])
        if len(self._tokens) > self.max_tokens:
            kept = 0
            for i in range(len(self.docs) - 1, -1, -1):
                kept += len(self.docs[i]) + 1
                if kept > self.max_tokens // 2:
                    self.docs = self.docs[i + 1 :] or self.docs[-1:]
                    break
            self._tokens, self._index = [], defaultdict(list)
            for kept_doc in self.docs:
                self._append(kept_doc)

    def _append(self, doc: list[int]) -> None:
        base = len(self._tokens)
        self._tokens.extend(doc)
        self._tokens.append(SEPARATOR)
        for i in range(len(doc) - self.key_len + 1):
            self._index[tuple(doc[i : i + self.key_len])].append(base + i)
        self._array = None

    @property
    def array(self) -> np.ndarray:
        if self._array is None:
            self._array = np.asarray(self._tokens, dtype=np.int64)
        return self._array

    def ends(self, key: Sequence[int] | np.ndarray, limit: int) -> np.ndarray:
        """End positions (exclusive) of the last ``limit`` occurrences of ``key``."""
        starts = self._index.get(tuple(int(t) for t in key), [])
        return np.asarray(starts[-limit:], dtype=np.int64) + self.key_len


def match_lengths(seq: np.ndarray, ends: np.ndarray, suffix: np.ndarray) -> np.ndarray:
    """How many tokens before each end position in ``seq`` equal the tail of ``suffix``.

    Example: ``seq=[7, 1, 2, 3]``, ``ends=[4]``, ``suffix=[9, 1, 2, 3]`` -> ``[3]``.
    """
    lengths = np.zeros(len(ends), dtype=np.int64)
    alive = np.ones(len(ends), dtype=bool)
    for depth in range(1, len(suffix) + 1):
        pos = ends - depth
        alive &= pos >= 0
        alive[alive] = seq[pos[alive]] == suffix[-depth]
        if not alive.any():
            break
        lengths[alive] = depth
    return lengths


def frequent_path(
    candidates: list[tuple[np.ndarray, int]], k: int, min_prob: float
) -> list[int]:
    """Walk forward from matched places, following the majority continuation.

    Each candidate is ``(sequence, position)``: the continuation starts at position.
    The walk stops when the path's empirical probability falls below ``min_prob``.
    """
    return [level.token for level in frequent_levels(candidates, k, min_prob)]


def frequent_levels(
    candidates: list[tuple[np.ndarray, int]], k: int, min_prob: float, alternatives: int = 0
) -> list[Level]:
    """:func:`frequent_path` with, at each step, the share of the places that agree
    (``confidence``) and up to ``alternatives`` runner-up continuations with theirs."""
    levels: list[Level] = []
    prob = 1.0
    alive = candidates
    for step in range(k):
        nexts = [
            int(seq[pos + step]) if pos + step < len(seq) else SEPARATOR for seq, pos in alive
        ]
        counts = Counter(t for t in nexts if t != SEPARATOR)
        if not counts:
            break
        ranked = counts.most_common(1 + alternatives)
        token, count = ranked[0]
        prob *= count / len(alive)
        if prob < min_prob:
            break
        levels.append(Level(token, count / len(alive), None,
                            [(t, c / len(alive)) for t, c in ranked[1:]]))
        alive = [c for c, t in zip(alive, nexts, strict=True) if t == token]
    return levels


class SuffixDrafter(Drafter):
    """Drafts from the longest suffix match in past answers and the live context."""

    name = "suffix"

    def __init__(
        self,
        corpus: Sequence[Sequence[int]] = (),
        *,
        max_depth: int = 24,
        min_prob: float = 0.1,
        key_len: int = 2,
        max_candidates: int = 256,
        branches: int = 0,
        min_branch: float = 0.1,
    ) -> None:
        self.index = SuffixIndex(key_len)
        self.max_depth, self.min_prob, self.max_candidates = max_depth, min_prob, max_candidates
        self.branches, self.min_branch = branches, min_branch  # tree drafting (tree.py)
        for doc in corpus:
            self.index.add(doc)

    def add_document(self, tokens: Sequence[int]) -> None:
        """Remember an answer so later conversations can draft from it."""
        self.index.add(tokens)

    def _context_ends(self, ctx: np.ndarray) -> np.ndarray:
        key_len = self.index.key_len
        if len(ctx) <= key_len:
            return np.zeros(0, dtype=np.int64)
        windows = sliding_window_view(ctx[:-1], key_len)  # [L-key_len, key_len]
        hits = np.flatnonzero((windows == ctx[-key_len:]).all(axis=1))
        return hits[-self.max_candidates :] + key_len

    def propose(
        self, context: Sequence[int], k: int, params: SamplingParams, generator: torch.Generator
    ) -> Draft:
        del params, generator
        ctx = np.asarray(context, dtype=np.int64)
        if k <= 0 or len(ctx) < self.index.key_len:
            return EMPTY_DRAFT
        suffix = ctx[-self.max_depth :]
        corpus = self.index.array
        sources = [
            (corpus, self.index.ends(ctx[-self.index.key_len :], self.max_candidates)),
            (ctx, self._context_ends(ctx)),
        ]
        scored = [
            (int(length), seq, int(end))
            for seq, ends in sources
            for length, end in zip(match_lengths(seq, ends, suffix), ends, strict=True)
        ]
        if not scored:
            return EMPTY_DRAFT
        best = max(length for length, _, _ in scored)
        candidates = [(seq, end) for length, seq, end in scored if length == best]
        levels = frequent_levels(candidates, k, self.min_prob, self.branches and 1)
        return branch(levels, self.branches, self.min_branch) if levels else EMPTY_DRAFT

    def observe(self, context: Sequence[int], proposed: int, accepted: int) -> None:
        del context, proposed, accepted
