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
them at its next draft, as after plain passes. Before a pass the loop asks
:meth:`HybridDrafter.part_for` which part drafts it (the lookup tried at the longest
draft the pass allows), so that the adaptive policy chooses the length with that part's
own acceptance and cost (:class:`engine.spec.policy.PartPolicies`): a lookup quoting the
prompt drafts long, a model short.

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
GREEDY, _NO_DRAWS = SamplingParams(), torch.Generator()  # a lookup draws nothing
NAMES = {MODEL: "hybrid", HEAD: "hybrid-eagle"}  # the method of each model part
MIN_LOOKUP = 2  # the fewest tokens a lookup must find to draft a pass (fewer only for k)


def lookup_drafts(found: int, k: int, min_lookup: int = MIN_LOOKUP) -> bool:
    """Whether a lookup that found ``found`` of at most ``k`` tokens drafts the pass."""
    return k > 0 and found >= min(min_lookup, k)


def _key(context: Sequence[int]) -> tuple[int, ...]:
    """What tells one pass's context from another's: its length and last tokens."""
    return (len(context), *context[-4:])


class HybridDrafter(Drafter):
    """Drafts with the suffix lookup when it matches, else with its model part."""

    def __init__(self, drafters: Mapping[str, Drafter], min_lookup: int = MIN_LOOKUP,
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
        # part_for's (context, part, lookup draft), for the propose on the same context
        self._routed: tuple[tuple[int, ...], str, Draft] | None = None

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

    def unread(self, context: Sequence[int]) -> int:
        return self.drafters[self.model].unread(context)

    def reads_for(self, part: str | None) -> bool:
        """A lookup's pass reads nothing: the model part reads the prompt before its own
        first draft."""
        return part != LOOKUP and self.reads_prompt

    def part_for(self, context: Sequence[int], k: int) -> str | None:
        """The lookup when it finds at least ``min_lookup`` tokens (fewer only where ``k``
        is smaller) among ``k``, else the model part; the next ``propose`` on this
        context drafts with it (a lookup's shorter draft is a prefix of its longer one)."""
        lookup = self.drafters[LOOKUP].propose(context, k, GREEDY, _NO_DRAWS)
        part = LOOKUP if lookup_drafts(len(lookup), k, self.min_lookup) else self.model
        self._routed = (_key(context), part, lookup)
        return part

    def propose(
        self, context: Sequence[int], k: int, params: SamplingParams, generator: torch.Generator
    ) -> Draft:
        routed, self._routed = self._routed, None
        part = None
        if routed is not None and routed[0] == _key(context):
            part, found = routed[1:]
            if part == LOOKUP and found.parents is None:  # a chain: its prefix is the draft
                return Draft(found.tokens[:k])
        if part != self.model:
            lookup = self.drafters[LOOKUP].propose(context, k, params, generator)
            if part == LOOKUP or lookup_drafts(len(lookup), k, self.min_lookup):
                return lookup
        return self.drafters[self.model].propose(context, k, params, generator)

    def observe(self, context: Sequence[int], proposed: int, accepted: int) -> None:
        for name in self.parts:
            self.drafters[name].observe(context, proposed, accepted)
