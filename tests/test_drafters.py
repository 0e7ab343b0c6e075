"""Model-free drafters (prompt lookup, suffix lookup) and the hybrid that prefers them."""

import numpy as np
import pytest
import torch

from engine.spec.drafters import Draft, Drafter
from engine.spec.drafters.hybrid import HybridDrafter
from engine.spec.drafters.ngram import NgramDrafter, ngram_lookup
from engine.spec.drafters.suffix import SuffixDrafter, SuffixIndex, frequent_path, match_lengths
from engine.spec.sampling import SamplingParams

GREEDY = SamplingParams()
GEN = torch.Generator()


def arr(*xs: int) -> np.ndarray:
    return np.asarray(xs, dtype=np.int64)


def test_ngram_finds_the_longest_most_recent_match() -> None:
    assert ngram_lookup(arr(1, 2, 3, 4, 2, 3), 3, min_n=1, max_n=2) == [4, 2, 3]
    # the 3-gram [7, 8, 9] beats the more recent 1-gram match of 9
    ctx = arr(7, 8, 9, 1, 1, 9, 5, 0, 7, 8, 9)
    assert ngram_lookup(ctx, 2, min_n=1, max_n=3) == [1, 1]
    assert ngram_lookup(arr(1, 2, 1, 2, 3, 1, 2), 2, min_n=2, max_n=2) == [3, 1]


def test_ngram_without_a_match_proposes_nothing() -> None:
    assert ngram_lookup(arr(1, 2, 3, 4), 3) == []
    assert ngram_lookup(arr(5), 3) == []
    assert ngram_lookup(arr(1, 2, 1, 2), 0) == []
    draft = NgramDrafter().propose([1, 2, 3, 4, 5], 4, GREEDY, GEN)
    assert draft.tokens == () and draft.probs is None


def test_match_lengths_extend_backwards() -> None:
    seq = arr(7, 1, 2, 3, 9, 1, 2, 3)
    assert match_lengths(seq, arr(4, 8), arr(5, 7, 1, 2, 3)).tolist() == [4, 3]


def test_frequent_path_follows_the_majority_and_stops_when_unsure() -> None:
    a, b, c = arr(1, 5, 6, 7), arr(1, 5, 6, 8), arr(1, 5, 9, 9)
    assert frequent_path([(a, 1), (b, 1), (c, 1)], 5, min_prob=0.1) == [5, 6, 7]
    assert frequent_path([(a, 1), (b, 1), (c, 1)], 5, min_prob=0.5) == [5, 6]


def test_suffix_drafts_from_earlier_answers() -> None:
    answer = [10, 11, 12, 13, 14, 15, 16]
    drafter = SuffixDrafter([answer, [3, 3, 3]])
    draft = drafter.propose([99, 98, 11, 12], 4, GREEDY, GEN)
    assert draft.tokens == (13, 14, 15, 16)
    assert drafter.propose([99, 98, 97], 4, GREEDY, GEN).tokens == ()
    drafter.add_document([97, 50, 51])
    assert drafter.propose([99, 98, 97], 4, GREEDY, GEN).tokens == ()  # one-token key too short
    assert drafter.propose([1, 97, 50], 2, GREEDY, GEN).tokens == (51,)


def test_suffix_also_drafts_from_the_live_context() -> None:
    drafter = SuffixDrafter()
    assert drafter.propose([4, 5, 6, 7, 1, 4, 5], 3, GREEDY, GEN).tokens == (6, 7, 1)


def test_suffix_index_forgets_the_oldest_documents_when_full() -> None:
    index = SuffixIndex(key_len=2, max_tokens=20)
    for start in range(0, 50, 5):
        index.add(list(range(start, start + 5)))
    assert len(index) <= 20
    assert index.ends([45, 46], 10).size == 1
    assert index.ends([0, 1], 10).size == 0


class Recording(Drafter):
    """A drafter that proposes fixed tokens (with a marker ``q``) and records calls."""

    name = "model"
    reads_prompt = True

    def __init__(self, tokens: tuple[int, ...]) -> None:
        self.tokens, self.calls, self.observed, self.prefilled = tokens, 0, 0, 0

    def prefill(self, context: list[int]) -> None:
        self.prefilled += 1

    def propose(self, context, k, params, generator) -> Draft:  # type: ignore[no-untyped-def]
        self.calls += 1
        return Draft(self.tokens[:k], torch.full((len(self.tokens[:k]), 4), 0.25))

    def observe(self, context, proposed, accepted) -> None:  # type: ignore[no-untyped-def]
        self.observed += 1


def test_hybrid_takes_the_lookup_when_it_matches_else_the_draft_model() -> None:
    model = Recording((40, 41, 42))
    table = {"suffix": SuffixDrafter([[5, 6, 7, 8, 9]]), "draft": model}
    hybrid = HybridDrafter(table, min_lookup=2)
    hybrid.prefill([1, 2])
    assert model.prefilled == 1
    found = hybrid.propose([1, 5, 6], 3, GREEDY, torch.Generator())
    assert found.tokens == (7, 8, 9) and found.probs is None and model.calls == 0
    assert hybrid.propose([1, 5, 6], 1, GREEDY, torch.Generator()).tokens == (7,)  # k < min
    missed = hybrid.propose([1, 2, 3], 3, GREEDY, torch.Generator())
    assert missed.tokens == (40, 41, 42) and missed.probs is not None and model.calls == 1
    short = hybrid.propose([1, 7, 8, 9], 3, GREEDY, torch.Generator())  # 1 lookup token only
    assert short.tokens == (40, 41, 42) and model.calls == 2
    table["suffix"] = SuffixDrafter([[1, 2, 3, 11, 12]])  # a swapped table entry is used
    assert hybrid.propose([1, 2, 3], 3, GREEDY, torch.Generator()).tokens == (11, 12)
    hybrid.observe([1, 2, 3], 2, 1)
    assert model.observed == 1
    with pytest.raises(ValueError, match="min_lookup"):
        HybridDrafter(table, min_lookup=0)


def test_a_hybrid_routes_a_pass_to_one_part_for_every_shorter_draft() -> None:
    model = Recording((40, 41, 42))
    table = {"suffix": SuffixDrafter([[5, 6, 7, 8, 9]]), "draft": model}
    hybrid = HybridDrafter(table, min_lookup=2)
    for k in (1, 2, 3):  # the lookup finds three tokens: each shorter draft is a prefix
        assert hybrid.part_for([1, 5, 6], 8) == "suffix"
        assert hybrid.propose([1, 5, 6], k, GREEDY, GEN).tokens == (7, 8, 9)[:k]
    assert model.calls == 0
    # one token found: the model part drafts the pass, even a one-token draft, which
    # unrouted would have been the lookup's
    assert hybrid.part_for([1, 7, 8], 8) == "draft"
    assert hybrid.propose([1, 7, 8], 1, GREEDY, GEN).tokens == (40,) and model.calls == 1
    assert hybrid.propose([1, 7, 8], 1, GREEDY, GEN).tokens == (9,)  # the route was used up
    assert hybrid.part_for([1, 7, 8], 1) == "suffix"  # a pass of one: one token suffices
    hybrid.part_for([1, 7, 8], 8)  # a route holds for its own context only
    assert hybrid.propose([1, 5, 6], 3, GREEDY, GEN).tokens == (7, 8, 9) and model.calls == 1
    assert Recording(()).part_for([1, 2], 4) is None  # a drafter of one part
    branching = SuffixDrafter([[5, 6, 7, 8, 9], [5, 6, 7, 1, 2]], branches=1)
    tree = HybridDrafter({"suffix": branching, "draft": model})
    assert tree.part_for([1, 5, 6], 8) == "suffix"  # a routed tree is drafted again at k
    drafted = tree.propose([1, 5, 6], 3, GREEDY, GEN)
    assert drafted.parents is not None
    assert drafted == branching.propose([1, 5, 6], 3, GREEDY, GEN)


class Seeing(Recording):
    """A model part that wants the target's features (as an EAGLE head does)."""

    wants_hidden = True
    feature_layers = (1, 3)

    def __init__(self, tokens: tuple[int, ...]) -> None:
        super().__init__(tokens)
        self.features: torch.Tensor | None = None

    def observe_hidden(self, features: torch.Tensor | None) -> None:
        self.features = features


def test_a_hybrid_with_a_head_hands_it_the_features_and_drafts_with_it() -> None:
    head, draft = Seeing((50, 51)), Recording((40, 41))
    table = {"suffix": SuffixDrafter([[5, 6, 7, 8, 9]]), "draft": draft, "eagle": head}
    hybrid = HybridDrafter(table, model="eagle")
    assert hybrid.name == "hybrid-eagle" and hybrid.parts == ("suffix", "eagle")
    assert hybrid.wants_hidden and hybrid.feature_layers == (1, 3) and hybrid.reads_prompt
    features = torch.ones(2, 12)
    hybrid.observe_hidden(features)
    assert head.features is features
    hybrid.prefill([1, 2])
    assert (head.prefilled, draft.prefilled) == (1, 0)
    assert hybrid.propose([1, 5, 6], 3, GREEDY, GEN).tokens == (7, 8, 9)
    assert hybrid.propose([1, 2, 3], 3, GREEDY, GEN).tokens == (50, 51)
    assert (head.calls, draft.calls) == (1, 0)
    plain = HybridDrafter(table)
    assert plain.name == "hybrid" and not plain.wants_hidden and plain.feature_layers == ()
    with pytest.raises(ValueError, match="draft or eagle"):
        HybridDrafter(table, model="ngram")
