"""Drafters propose the next tokens cheaply; the target verifies them in one pass.

Every drafter implements :class:`Drafter`:

* ``propose(context, k, params, generator)`` returns up to ``k`` tokens that might
  follow ``context`` (all ids so far: prompt plus answer), with the distributions
  ``q`` they were sampled from, or ``probs=None`` when the drafter is deterministic
  (n-gram and suffix lookup: ``q`` is one-hot at the proposed token). A drafter may
  return a tree of alternatives (``Draft.parents``) when the runner verifies trees;
  the decoding loop then checks every branch in the same single target pass.
* ``observe(context, proposed, accepted)`` tells the drafter how many of its last
  proposals the target kept, for drafters that adapt.
* A drafter with a model of its own (draft model, EAGLE head) reports in
  ``Draft.catch_up`` how many context tokens it fed that model before its first draft
  step: 1 or 2 when it drafted the pass before, more after passes it sat out. The
  adaptive policy measures the cost of a draft step only on short catch-ups.
* Optionally, ``wants_hidden = True`` and ``observe_hidden(features)``: the decoding
  loop then hands over the target's final hidden states of ``context[:-1]``
  (``[len(context) - 1, H]``) before each ``propose`` (EAGLE heads).
* Optionally, ``prefill(context)``: catch up with the prompt (a draft model's or a
  head's own cache) before the first pass, so that this one-off cost counts as prompt
  processing and not as the cost of drafting a token, which the adaptive policy weighs.

Drafters never see text: the engine knows only token ids.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from engine.cpu.kernels import tree_depths
from engine.sampling import SamplingParams


@dataclass(frozen=True)
class Draft:
    """Proposed tokens ``[G]`` and their draft distributions ``[G, V]`` (or ``None``).

    ``catch_up``: context tokens fed to the drafter's own model before drafting (0 for
    lookups). A chain by default; with ``parents`` a tree: ``parents[i]`` is the index of token
    ``i``'s parent in ``tokens`` (always lower), ``-1`` under the pending token. Siblings
    are alternatives in order: in sampling, each drawn from the ``probs`` row they share
    without the earlier ones (see :func:`engine.acceptance.tree_accept`).
    """

    tokens: tuple[int, ...]
    probs: torch.Tensor | None = None
    parents: tuple[int, ...] | None = None
    catch_up: int = 0

    def __len__(self) -> int:
        return len(self.tokens)

    def main_chain(self) -> "Draft":
        """The tree's first branch at every level (its chain) as a chain draft."""
        if self.parents is None:
            return self
        keep, at = [], -1
        while (child := next((i for i, p in enumerate(self.parents) if p == at), None)) \
                is not None:
            keep.append(child)
            at = child
        probs = None if self.probs is None else self.probs[keep]
        return Draft(tuple(self.tokens[i] for i in keep), probs, catch_up=self.catch_up)

    @property
    def depth(self) -> int:
        """Tokens on the longest path (the length for a chain)."""
        if self.parents is None:
            return len(self.tokens)
        return max(tree_depths(self.parents), default=-1) + 1


EMPTY_DRAFT = Draft(())


class Drafter(Protocol):
    """What the decoding loop needs from a drafting method."""

    name: str

    def propose(
        self,
        context: Sequence[int],
        k: int,
        params: SamplingParams,
        generator: torch.Generator,
    ) -> Draft: ...

    def observe(self, context: Sequence[int], proposed: int, accepted: int) -> None: ...
