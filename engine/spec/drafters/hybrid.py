"""Lookup first, a model otherwise: free drafts where the text repeats itself.

Contract: :class:`HybridDrafter` asks the suffix lookup (:mod:`engine.spec.drafters.suffix`:
the prompt, the answer so far and past answers) for a draft; when the lookup finds at
least ``min_lookup`` tokens, they are the pass's draft (``q`` one-hot, as for every
lookup). Otherwise its model part drafts (with its ``q``): the draft model (method
``hybrid``) or the EAGLE head (method ``hybrid-eagle``). Each pass's draft comes whole
from one drafter, so the acceptance rule keeps the target's distribution. The hybrid
takes on what its model part needs from the loop: the target's features for a head
(``wants_hidden``, ``feature_layers``, handed on by ``observe_hidden``) and the prompt
reading for both. A model part that sat out passes (the lookup drafted) catches up with
them at its next draft, as after plain passes.

Why: a lookup costs next to nothing while a model's draft step costs a share of a target
step (the calibration measures it); quoted text (summaries, edited code) is found by the
lookup, and the model covers the rest. The drafters are looked up by name in the
engine's table at every pass, so a table entry swapped for another (the benchmark gives
each row its own suffix corpus, and a newly trained head replaces the old one) is the
one used.
"""

from collections.abc import Mapping, Sequence

import torch

from engine.spec.drafters import Draft, Drafter
from engine.spec.sampling import SamplingParams

LOOKUP, MODEL, HEAD = "suffix", "draft", "eagle"
NAMES = {MODEL: "hybrid", HEAD: "hybrid-eagle"}  # the method of each model part


class HybridDrafter(Drafter):
    """Drafts with the suffix lookup when it matches, else with its model part."""

    def __init__(self, drafters: Mapping[str, Drafter], min_lookup: int = 2,
                 model: str = MODEL) -> None:
        if min_lookup < 1:
            raise ValueError(f"min_lookup must be at least 1, not {min_lookup}")
        if model not in NAMES:
            raise ValueError(f"a hybrid drafts with {' or '.join(NAMES)}, not {model!r}")
        self.drafters = drafters
        self.min_lookup = min_lookup
        self.model = model
        self.name = NAMES[model]
        self.parts = (LOOKUP, model)

    @property
    def reads_prompt(self) -> bool:  # type: ignore[override]
        return self.drafters[self.model].reads_prompt

    @property
    def wants_hidden(self) -> bool:  # type: ignore[override]
        return self.drafters[self.model].wants_hidden

    @property
    def feature_layers(self) -> tuple[int, ...]:  # type: ignore[override]
        return self.drafters[self.model].feature_layers

    def observe_hidden(self, features: torch.Tensor | None) -> None:
        self.drafters[self.model].observe_hidden(features)

    def prefill(self, context: Sequence[int]) -> None:
        self.drafters[self.model].prefill(context)

    def propose(
        self, context: Sequence[int], k: int, params: SamplingParams, generator: torch.Generator
    ) -> Draft:
        lookup = self.drafters[LOOKUP].propose(context, k, params, generator)
        if len(lookup) >= min(self.min_lookup, k):
            return lookup
        return self.drafters[self.model].propose(context, k, params, generator)

    def observe(self, context: Sequence[int], proposed: int, accepted: int) -> None:
        for name in self.parts:
            self.drafters[name].observe(context, proposed, accepted)
