"""The replay of drafting on recorded answers keeps what real greedy decoding keeps."""

import pytest
import torch

from engine.models.loading import LoadedModel
from engine.spec.decoding import decode
from engine.spec.drafters.draft_model import DraftModelDrafter
from engine.spec.drafters.ngram import NgramDrafter
from engine.spec.runner import ModelRunner
from engine.spec.sampling import SamplingParams
from engine.tools.replay import (
    Case,
    Method,
    Trace,
    interpolate,
    measure_costs,
    model_chain,
    predict,
    replay,
    trace,
)
from tests.tiny import tiny_model

VOCAB = 64
PROMPT = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6]


def decoded(target: torch.nn.Module, drafter: object | None, k: int = 3,
            n: int = 40) -> tuple[list[int], list[int]]:
    """Tokens and the accepted count of each pass of real greedy decoding."""
    steps = list(decode(ModelRunner(target), PROMPT, params=SamplingParams(), max_new_tokens=n,
                        max_context=256, drafter=drafter, num_draft_tokens=k))  # type: ignore[arg-type]
    return [t for s in steps for t in s.tokens], [s.accepted for s in steps if s.forwarded]


def test_interpolate_goes_through_the_points_and_extends_the_last_slope() -> None:
    cost = interpolate({1: 1.0, 2: 1.1, 4: 1.5})
    assert cost(2) == 1.1 and cost(3) == pytest.approx(1.3) and cost(6) == pytest.approx(1.9)


def test_model_chain_stops_at_a_miss_or_a_low_confidence() -> None:
    answer = [1, 2, 3, 4, 5, 6]
    tr = Trace([1, 2, 9, 4, 5, 7], [0.9, 0.9, 0.9, 0.9, 0.2, 0.9], 0.0)
    assert model_chain(tr, answer, 0, 4, 0.5) == (4, 2)  # missed at 3: assumed to run on
    assert model_chain(tr, answer, 3, 4, 0.5) == (2, 2)  # unsure of 5 (rightly): then stops
    assert model_chain(tr, answer, 5, 4, 0.5) == (4, 0)  # a miss
    assert model_chain(tr, answer[:5], 3, 4, 0.1) == (2, 2)  # the answer ends


def test_replayed_lookup_keeps_what_decoding_kept() -> None:
    target = tiny_model("llama", vocab_size=VOCAB, seed=1, scale=4.0)
    answer, plain_passes = decoded(target, None)
    assert len(plain_passes) == len(answer)
    _, kept = decoded(target, NgramDrafter(), k=3)
    case = Case("code completion", PROMPT, answer, 2.0, 1.0)
    flat = interpolate({1: 1.0, 2: 1.0})
    units, replayed = replay(case, None, Method("ngram k=3", 3, lookup="ngram"), flat, flat)
    assert replayed == kept
    assert units == len(kept) - 1  # every pass costs t(1) here, less the first token's


@pytest.mark.parametrize(("seed", "min_confidence"), [(1, 0.0), (2, 0.0), (2, 0.6)])
def test_replayed_draft_model_keeps_what_decoding_kept(seed: int, min_confidence: float) -> None:
    target = tiny_model("llama", vocab_size=VOCAB, seed=1, scale=4.0)
    draft = tiny_model("llama", vocab_size=VOCAB, seed=seed, scale=4.0)
    loaded = LoadedModel("d", draft, None, None, 256)
    answer, _ = decoded(target, None)
    tokens, kept = decoded(target, DraftModelDrafter(loaded, VOCAB, min_confidence), k=4)
    assert tokens == answer
    case = Case("summary", PROMPT, answer, 2.0, 1.0)
    tr = trace(DraftModelDrafter(loaded, VOCAB).runner, case)
    method = Method("draft", 4, model=True, min_confidence=min_confidence)
    flat = interpolate({1: 1.0, 2: 1.0})
    assert replay(case, tr, method, flat, flat)[1] == kept


def test_a_free_perfect_drafter_is_predicted_k_plus_one_times_faster() -> None:
    answer = list(range(10, 30))
    case = Case("free chat", [1, 2, 3], answer, 21.0, 2.0)  # 1 s per token after the first
    tr = Trace(answer, [1.0] * len(answer), 0.0)
    free, flat = interpolate({1: 0.0, 2: 0.0}), interpolate({1: 1.0, 2: 1.0})
    speedup, generation = predict([case], [tr], Method("draft", 4, model=True), flat, free)[
        "overall"]
    assert generation == pytest.approx(19 / 3)  # 4 passes of 5 tokens, less the first token's
    assert speedup == pytest.approx(21 / (2 + 3))


def test_costs_are_measured_for_every_size_of_both_models() -> None:
    target = ModelRunner(tiny_model("llama", vocab_size=VOCAB, seed=1, scale=4.0))
    draft = ModelRunner(tiny_model("llama", vocab_size=VOCAB, seed=2, scale=4.0))
    target_s, draft_s = measure_costs(target, draft, reps=1)
    assert sorted(target_s) == [1, 2, 3, 4, 5, 8] and sorted(draft_s) == [1, 2, 4, 8]
    assert all(v > 0 for v in [*target_s.values(), *draft_s.values()])
    assert measure_costs(target, None, reps=1)[1] == {}
