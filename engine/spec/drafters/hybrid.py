"""Lookup first, the draft model otherwise: free drafts where the text repeats itself.

Contract: :class:`HybridDrafter` asks the suffix lookup (:mod:`engine.spec.drafters.suffix`:
the prompt, the answer so far and past answers) for a draft; when the lookup finds at
least ``min_lookup`` tokens, they are the pass's draft (``q`` one-hot, as for every
lookup). Otherwise the draft model drafts (with its ``q``). Each pass's draft comes
whole from one drafter, so the acceptance rule keeps the target's distribution.

Why: a lookup costs next to nothing while a draft-model token costs a sizeable share of
a target step (the calibration measures it); quoted text (summaries, edited code) is
found by the lookup, and the draft model covers the rest. The drafters are looked up
by name in the engine's table at every pass, so a table entry swapped for another (the
benchmark gives each row its own suffix corpus) is the one used.
"""

from collections.abc import Mapping, Sequence

import torch

from engine.spec.drafters import Draft, Drafter
from engine.spec.sampling import SamplingParams

LOOKUP, MODEL = "suffix", "draft"


class HybridDrafter(Drafter):
    """Drafts with the suffix lookup when it matches, else with the draft model."""

    name = "hybrid"
    parts = (LOOKUP, MODEL)

    def __init__(self, drafters: Mapping[str, Drafter], min_lookup: int = 2) -> None:
        if min_lookup < 1:
            raise ValueError(f"min_lookup must be at least 1, not {min_lookup}")
        self.drafters = drafters
        self.min_lookup = min_lookup

    @property
    def reads_prompt(self) -> bool:  # type: ignore[override]
        return self.drafters[MODEL].reads_prompt

    def prefill(self, context: Sequence[int]) -> None:
        self.drafters[MODEL].prefill(context)

    def propose(
        self, context: Sequence[int], k: int, params: SamplingParams, generator: torch.Generator
    ) -> Draft:
        lookup = self.drafters[LOOKUP].propose(context, k, params, generator)
        if len(lookup) >= min(self.min_lookup, k):
            return lookup
        return self.drafters[MODEL].propose(context, k, params, generator)

    def observe(self, context: Sequence[int], proposed: int, accepted: int) -> None:
        for name in (LOOKUP, MODEL):
            self.drafters[name].observe(context, proposed, accepted)
