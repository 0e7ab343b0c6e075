"""Drafters propose the next tokens cheaply; the target verifies them in one pass.

Every drafter implements :class:`Drafter`:

* ``propose(context, k, params, generator)`` returns up to ``k`` tokens that might
  follow ``context`` (all ids so far: prompt plus answer), with the distributions
  ``q`` they were sampled from, or ``probs=None`` when the drafter is deterministic
  (n-gram and suffix lookup: ``q`` is one-hot at the proposed token).
* ``observe(context, proposed, accepted)`` tells the drafter how many of its last
  proposals the target kept, for drafters that adapt.
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

from engine.sampling import SamplingParams


@dataclass(frozen=True)
class Draft:
    """Proposed tokens ``[G]`` and their draft distributions ``[G, V]`` (or ``None``)."""

    tokens: tuple[int, ...]
    probs: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.tokens)


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
