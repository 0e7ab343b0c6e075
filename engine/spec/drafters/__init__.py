"""Drafters propose the next tokens cheaply; the target verifies them in one pass.

Every drafting method subclasses :class:`Drafter`, which declares every capability the
decoding loop uses, each with a default, so the loop never probes for one:

* ``propose(context, k, params, generator)`` (required) returns up to ``k`` tokens that
  might follow ``context`` (all ids so far: prompt plus answer), with the distributions
  ``q`` they were sampled from, or ``probs=None`` when the drafter is deterministic
  (n-gram and suffix lookup: ``q`` is one-hot at the proposed token). A drafter may
  return a tree of alternatives (``Draft.parents``); the decoding loop then checks every
  branch in the same single target pass.
* ``observe(context, proposed, accepted)`` tells the drafter how many of its last
  proposals the target kept (default: ignored).
* ``wants_hidden`` (default ``False``) and ``observe_hidden(features)``: the loop hands
  over the target's final hidden states of ``context[:-1]`` (``[len(context) - 1, H]``)
  before each ``propose`` and ``prefill`` (EAGLE heads); with ``feature_layers`` (default
  none) the residual streams after those target layers come first, side by side
  (``[len(context) - 1, (len(feature_layers) + 1) H]``, EAGLE-3 heads).
* ``reads_prompt`` (default ``False``) and ``prefill(context)``: a drafter with a model
  of its own catches up with the prompt before its first draft of an answer, so that this
  one-off cost counts as prompt processing and not as the cost of drafting a token, which
  the adaptive policy weighs; an answer it never drafts for never has it read the prompt.
  ``reads_for(part)`` says whether a pass drafted by ``part`` needs that reading (the
  hybrid's lookup does not). ``prefill`` is idempotent; the default does nothing.
  ``unread(context)`` (default 0) says how many tokens that reading would take now, its
  cache considered, without moving anything, so ``auto`` can cost a drafter that has to
  catch up.
* ``reset()`` forgets whatever the drafter cached (default: nothing to forget).
* ``parts`` (default none) names the engine's other drafters this one drafts with, one
  of them each pass (the hybrid: the lookup, else the draft model), so a pass may cost
  what its dearest part costs. ``part_for(context, k)`` (default ``None``: one part)
  says which of them drafts the coming pass if it may draft up to ``k`` tokens; a
  following ``propose`` on the same context, for any ``k`` up to that, drafts with that
  part, so the adaptive policy can choose the length with that part's own figures.
* A drafter with a model of its own reports in ``Draft.catch_up`` how many context tokens
  it fed that model before its first draft step: 1 or 2 when it drafted the pass before,
  more after passes it sat out. The adaptive policy measures the cost of a draft step only
  on short catch-ups.

Drafters never see text: the engine knows only token ids.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.spec.sampling import SamplingParams


@dataclass(frozen=True)
class Draft:
    """Proposed tokens ``[G]`` and their draft distributions ``[G, V]`` (or ``None``).

    ``catch_up``: context tokens fed to the drafter's own model before drafting (0 for
    lookups). A chain by default; with ``parents`` a tree: ``parents[i]`` is the index of token
    ``i``'s parent in ``tokens`` (always lower), ``-1`` under the pending token. Siblings
    are alternatives in order: in sampling, each drawn from the ``probs`` row they share
    without the earlier ones (see :func:`engine.spec.acceptance.tree_accept`).
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
        depths: list[int] = []  # each token's distance below the pending token
        for parent in self.parents:
            depths.append(depths[parent] + 1 if parent >= 0 else 1)
        return max(depths, default=0)


EMPTY_DRAFT = Draft(())


class Drafter:
    """The base of every drafting method (see the module for the contract)."""

    name: str = "drafter"
    wants_hidden: bool = False  # the loop hands over the target's features
    feature_layers: tuple[int, ...] = ()  # target layers whose residual streams come too
    reads_prompt: bool = False  # prefill reads the prompt into a model of its own
    parts: tuple[str, ...] = ()  # the engine's drafters it drafts with, pass by pass

    def propose(
        self,
        context: Sequence[int],
        k: int,
        params: SamplingParams,
        generator: torch.Generator,
    ) -> Draft:
        raise NotImplementedError(f"{type(self).__name__} does not propose")

    def part_for(self, context: Sequence[int], k: int) -> str | None:
        """The part (one of ``parts``) that drafts the coming pass after ``context``, if
        it may draft up to ``k`` tokens; ``None`` for a drafter of one part."""
        del context, k
        return None

    def observe(self, context: Sequence[int], proposed: int, accepted: int) -> None:
        """How many of the last ``proposed`` tokens the target kept."""
        del context, proposed, accepted

    def observe_hidden(self, features: torch.Tensor | None) -> None:
        """The target's features of ``context[:-1]`` (drafters that want them)."""
        del features

    def prefill(self, context: Sequence[int]) -> None:
        """Catch up with ``context`` before the first draft (drafters that read prompts)."""
        del context

    def reads_for(self, part: str | None) -> bool:
        """Whether a pass drafted by ``part`` (:meth:`part_for`'s answer) needs the
        prompt read first (:meth:`prefill`)."""
        del part
        return self.reads_prompt

    def unread(self, context: Sequence[int]) -> int:
        """Tokens of ``context`` the drafter's own model would read before its first draft
        after it (``prefill`` and the first ``propose``), as its caches stand; nothing
        moves. 0 for drafters without a model of their own."""
        del context
        return 0

    def reset(self) -> None:
        """Forget every cached position (drafters with caches of their own)."""
