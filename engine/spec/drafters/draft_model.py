"""Drafting with a small model of the target's family (Leviathan et al. 2022).

The draft model keeps its own KV cache across passes. Each ``propose`` syncs that
cache to the context by its shared prefix (so rejected drafts are cropped away and
accepted ones are reused), then samples up to ``k`` tokens one at a time with the same
sampling processing as the target, returning their distributions ``q``. Drafting
stops early after a token the draft itself gave less than ``min_confidence``
(its probability), since the guesses after it would most likely be rejected (the
threshold's replay measurements: docs/measurements.md). Its decoding steps compute
logits only for the frequent ids and the end tokens, the frequent rows re-rounded to 4
bits (:mod:`engine.spec.drafters.vocab`): cheaper steps, the same lossless acceptance. Greedy
steps read those ids' logits only and never spread them over the whole vocabulary; sampled
ones spread them (``-inf`` elsewhere), since acceptance divides by the whole ``q``. With
``branches`` the chain gets up to that many alternatives as leaves beside it
(:mod:`engine.spec.drafters.tree`), for runners that verify trees.

The draft model reads only a window of the context: at most ``window`` tokens of a
new prompt (its end), and what follows them from then on, because reading a long prompt
costs the draft model more than its drafts win back (the window's measurements:
docs/measurements.md). What the draft does not read only makes its guesses worse; the
target checks every one as before. Like the target's, its runner keeps the caches of a few other
conversations (:meth:`engine.spec.runner.ModelRunner.swap_in`), each with its window's start.
"""

from collections.abc import Sequence
from dataclasses import replace

import torch

from engine.models.loading import LoadedModel
from engine.spec.drafters import EMPTY_DRAFT, Draft, Drafter
from engine.spec.drafters.tree import Level, branch, choose
from engine.spec.drafters.vocab import ShortHead, draft_head
from engine.spec.runner import ModelRunner, shared_prefix
from engine.spec.sampling import SamplingParams

DRAFT_WINDOW = 256  # prompt tokens the draft model reads (the module docstring says why)


def fit_vocab(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Truncate or pad (with -inf) the last axis of ``logits`` to ``vocab_size``."""
    extra = vocab_size - logits.shape[-1]
    if extra <= 0:
        return logits[..., :vocab_size]
    pad = torch.full((*logits.shape[:-1], extra), float("-inf"), dtype=logits.dtype)
    return torch.cat([logits, pad], dim=-1)


class DraftModelDrafter(Drafter):
    """Proposes tokens by sampling a smaller causal LM autoregressively."""

    name = "draft"
    reads_prompt = True

    def __init__(
        self, draft: LoadedModel, target_vocab_size: int, min_confidence: float = 0.8,
        draft_vocab: int | None = None, branches: int = 0, min_branch: float = 0.1,
        int4_vocab: bool = True, window: int | None = DRAFT_WINDOW, ranked_vocab: bool = False,
    ) -> None:
        if window is not None and window < 1:
            raise ValueError(f"the draft window must be at least 1 token, not {window}")
        self.loaded = draft
        # decoding steps read the draft's lm_head only for frequent ids (int4) and end tokens:
        # ids below 65,536, or with ranked_vocab its tokenizer's ranking (docs/vocab.md: a
        # cheaper step, but fewer summary and chat drafts accepted, so not by default)
        head = draft_head(draft.model.get_output_embeddings(), draft.eos_ids,
                          draft.tokenizer if ranked_vocab else None, draft_vocab, int4_vocab)
        self.runner = ModelRunner(draft.model, head)
        self.vocab_size = target_vocab_size
        # greedy steps: the short head's kept logits, of the kept ids the target has
        self.short: ShortHead | None = None
        self.columns = torch.zeros(0, dtype=torch.long)  # [N] the target ids they are
        self.within: torch.Tensor | None = None  # [N'] which kept ids are those; None: all
        if isinstance(head, ShortHead):
            kept = head.columns
            inside = kept < target_vocab_size
            if bool(inside.any()):
                self.short, self.columns = head, kept[inside]
                self.within = None if bool(inside.all()) else inside
        self.min_confidence = min_confidence
        self.branches, self.min_branch = branches, min_branch  # tree drafting (tree.py)
        self.window = window

    @property
    def start(self) -> int:
        """Where in the context the draft model's reading (and its cache) begins."""
        return self.runner.offset

    def fits(self, ids: Sequence[int], offset: int, context: Sequence[int]) -> bool:
        """Whether a cache of ``ids`` from ``offset`` on can go on reading ``context``: it
        holds a prefix of the context from there and at most ``window`` tokens are new."""
        if self.window is None or offset >= len(context):
            return False
        kept = shared_prefix(ids, context[offset:])
        return kept > 0 and len(context) - offset - kept <= self.window

    def _fitting(self, context: Sequence[int]) -> int | None:
        """The cache (with a window) that can go on reading ``context`` (:meth:`fits`): -1
        for the current one, ``i`` for parked cache ``i``, ``None`` for none."""
        if self.fits(self.runner.ids, self.runner.offset, context):
            return -1
        return next((i for i, p in enumerate(self.runner.parked)
                     if self.fits(p.ids, p.offset, context)), None)

    def view(self, context: Sequence[int]) -> Sequence[int]:
        """The part of ``context`` the draft model reads, moving its start when needed.

        The start stays while the cache fits the context (:meth:`fits`); else the cache of
        another conversation that fits is swapped back in (the runner keeps a few parked);
        else the runner starts over at the context's last ``window`` tokens.
        """
        if self.window is None:
            return context
        back = self._fitting(context)
        if back is None:
            self.runner.start_over(max(0, len(context) - self.window))
        elif back >= 0:
            self.runner.swap_in(back)
        return context[self.runner.offset:]

    def unread(self, context: Sequence[int]) -> int:
        """Tokens :meth:`view` would leave to read, its last one included: after the cache
        it would keep or swap in, else a fresh window's; nothing moves."""
        back = -1 if self.window is None else self._fitting(context)
        if back is None:
            return min(len(context), self.window or len(context))
        cache = self.runner if back < 0 else self.runner.parked[back]
        seen = context[cache.offset:]
        return len(seen) - min(shared_prefix(cache.ids, seen), max(0, len(seen) - 1))

    def prefill(self, context: Sequence[int]) -> None:
        """Cache the view of ``context[:-1]`` (the first ``propose`` feeds the last token)."""
        if len(context) > 1:
            self.runner.sync(self.view(context)[:-1])

    def propose(
        self, context: Sequence[int], k: int, params: SamplingParams, generator: torch.Generator
    ) -> Draft:
        position = len(context)  # of the first drafted token, in the whole context
        context = self.view(context)
        k = min(k, self.loaded.max_context - len(context))
        if k <= 0 or not context:
            return EMPTY_DRAFT
        # Keep at least the last context token uncached so its logits come out.
        kept = min(self.runner.common_prefix(context), len(context) - 1)
        self.runner.truncate(kept)
        short = self._kept_logits if params.greedy and self.short is not None else None
        logits = self.runner.sync(context, short)  # [V] or, from short, [N]
        assert logits is not None
        levels: list[Level] = []
        for i in range(k):
            alternatives, at = self.branches and 1, position + i
            if short is not None:  # the kept ids' logits only
                levels.append(choose(logits, params, generator, alternatives, at, self.columns))
            else:
                row = fit_vocab(logits, self.vocab_size)  # [V]
                levels.append(choose(row, params, generator, alternatives, at))
            if levels[-1].confidence < self.min_confidence:
                break  # later guesses would most likely be rejected
            if i + 1 < k:
                logits = self.runner.forward([levels[-1].token], head=short)[-1]
        return replace(branch(levels, self.branches, self.min_branch),
                       catch_up=len(context) - kept)

    def _kept_logits(self, x: torch.Tensor) -> torch.Tensor:
        """The short head's logits ``[rows, N]`` of the normed states ``x`` ``[rows, H]``,
        over :attr:`columns` (kept ids the target's vocabulary has)."""
        assert self.short is not None
        logits, _ = self.short.kept_logits(x)  # [rows, N']
        return logits if self.within is None else logits[..., self.within]

    def reset(self) -> None:
        self.runner.reset()
