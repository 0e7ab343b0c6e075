"""The replay of drafting on recorded answers keeps what real greedy decoding keeps."""

import pytest
import torch

from engine.heads.model import EagleHead, HeadConfig
from engine.models.loading import LoadedModel
from engine.spec.decoding import decode
from engine.spec.drafters.draft_model import DraftModelDrafter
from engine.spec.drafters.eagle import EagleDrafter
from engine.spec.drafters.hybrid import HybridDrafter
from engine.spec.drafters.ngram import NgramDrafter
from engine.spec.drafters.suffix import SuffixDrafter
from engine.spec.policy import DraftPolicy, PartPolicies
from engine.spec.runner import ModelRunner
from engine.spec.sampling import SamplingParams
from engine.tools.replay import (
    HEAD_DEPTH,
    LOOKUP,
    MODEL,
    Case,
    HeadTrace,
    Method,
    Trace,
    head_trace,
    interpolate,
    measure_costs,
    methods,
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
    method = Method("draft", 4, model="draft", min_confidence=min_confidence)
    flat = interpolate({1: 1.0, 2: 1.0})
    assert replay(case, tr, method, flat, flat)[1] == kept


def test_a_replayed_hybrid_routes_each_pass_as_decoding_does() -> None:
    target = tiny_model("llama", vocab_size=VOCAB, seed=1, scale=4.0)
    draft = tiny_model("llama", vocab_size=VOCAB, seed=2, scale=4.0)
    loaded = LoadedModel("d", draft, None, None, 256)
    answer, _ = decoded(target, None)
    table = {"suffix": SuffixDrafter(), "draft": DraftModelDrafter(loaded, VOCAB, 0.0)}
    tokens, kept = decoded(target, HybridDrafter(table), k=4)
    assert tokens == answer
    case = Case("summary", PROMPT, answer, 2.0, 1.0)
    tr = trace(DraftModelDrafter(loaded, VOCAB).runner, case)
    flat = interpolate({1: 1.0, 2: 1.0})
    hybrid = Method("hybrid k=4", 4, lookup="suffix", model="draft", min_confidence=0.0)
    assert replay(case, tr, hybrid, flat, flat)[1] == kept
    adaptive = Method("hybrid", None, lookup="suffix", model="draft", min_confidence=0.0)
    assert isinstance(adaptive.policy, PartPolicies)  # one policy per part, as the engine's
    replay(case, tr, adaptive, flat, interpolate({1: 0.1, 2: 0.2}))
    assert all(p.asked > 0 for p in adaptive.policy.parts.values())  # both parts drafted


def test_a_free_perfect_drafter_is_predicted_k_plus_one_times_faster() -> None:
    answer = list(range(10, 30))
    case = Case("free chat", [1, 2, 3], answer, 21.0, 2.0)  # 1 s per token after the first
    tr = Trace(answer, [1.0] * len(answer), 0.0)
    free, flat = interpolate({1: 0.0, 2: 0.0}), interpolate({1: 1.0, 2: 1.0})
    speedup, generation = predict([case], [tr], Method("draft", 4, model="draft"), flat, free)[
        "overall"]
    assert generation == pytest.approx(19 / 3)  # 4 passes of 5 tokens, less the first token's
    assert speedup == pytest.approx(21 / (2 + 3))


def test_a_model_pays_its_prompt_reading_only_in_answers_it_drafts_for() -> None:
    """As the engine reads a drafter's prompt before its first draft: a fixed length pays
    the reading (6 s here) once; an adaptive model too dear to pay never drafts nor reads."""
    answer = list(range(10, 30))
    case = Case("free chat", [1, 2, 3], answer, 21.0, 2.0)  # 1 s per token after the first
    tr = Trace(answer, [1.0] * len(answer), 6.0)
    free, flat = interpolate({1: 0.0, 2: 0.0}), interpolate({1: 1.0, 2: 1.0})
    fixed = predict([case], [tr], Method("draft", 4, model="draft"), flat, free)["overall"]
    assert fixed == (pytest.approx(21 / (2 + 3 + 6)), pytest.approx(19 / (3 + 6)))
    dear = interpolate({1: 5.0, 2: 5.0})  # a draft step of five target steps
    policy = DraftPolicy.calibrated(1.0, {k: 1.0 + 0.5 * (k - 1) for k in range(2, 9)}, 5.0)
    adaptive = Method("draft", None, model="draft", policy=policy)
    assert predict([case], [tr], adaptive, flat, dear)["overall"] == (1.0, 1.0)


def test_costs_are_measured_for_every_size_of_both_models() -> None:
    target = ModelRunner(tiny_model("llama", vocab_size=VOCAB, seed=1, scale=4.0))
    draft = ModelRunner(tiny_model("llama", vocab_size=VOCAB, seed=2, scale=4.0))
    target_s, draft_s = measure_costs(target, draft, reps=1)
    assert sorted(target_s) == [1, 2, 3, 4, 5, 8] and sorted(draft_s) == [1, 2, 4, 8]
    assert all(v > 0 for v in [*target_s.values(), *draft_s.values()])
    assert measure_costs(target, None, reps=1)[1] == {}


def repeating_head(target: torch.nn.Module, taps: tuple[int, ...] = (), noise: float = 0.0,
                   seed: int = 0) -> EagleHead:
    """A head whose predicted feature is the one it reads, so it drafts the last token again
    and again (the target's greedy token for the row it read): right all along a run of one
    token. ``noise`` stirs in the fused lower layers."""
    torch.manual_seed(seed)
    head = EagleHead(HeadConfig.for_target(target.config, 32, taps, fuse_rank=4))
    size = head.config.hidden_size
    with torch.no_grad():
        head.fc.weight.zero_()
        head.fc.weight[:, :size] = torch.eye(size)
        head.fc.bias.zero_()
        for layer in head.decoder.layers:  # the residual stream passes through unchanged
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        if head.fuse_up is not None:
            head.fuse_up.weight.normal_(0.0, noise)
    return head.to(target.dtype).eval()


@pytest.mark.parametrize(("kind", "taps", "min_confidence"),
                         [("llama", (), 0.0), ("qwen2", (), 0.0), ("llama", (), 0.2),
                          ("llama", (1, 2), 0.0), ("qwen2", (1, 2), 0.2)])
def test_replayed_eagle_head_keeps_what_decoding_kept(kind: str, taps: tuple[int, ...],
                                                      min_confidence: float) -> None:
    target = tiny_model(kind, vocab_size=12, layers=4, seed=2, scale=4.0)
    answer, _ = decoded(target, None)
    drafter = EagleDrafter(repeating_head(target, taps, noise=0.5), target,
                           min_confidence=min_confidence, draft_vocab=10, keep_ids=[11])
    tokens, kept = decoded(target, drafter, k=4)
    assert tokens == answer and max(kept) >= 2  # whole runs of drafts were kept
    case = Case("free chat", PROMPT, answer, 2.0, 1.0)
    tr = head_trace(drafter, target, case, 4)
    method = Method("eagle", 4, model="eagle", min_confidence=min_confidence)
    flat = interpolate({1: 1.0, 2: 1.0})
    assert replay(case, tr, method, flat, flat)[1] == kept


def test_a_head_trace_reads_its_chains_by_step() -> None:
    tr = HeadTrace([], [], 0.0, steps=[[1, 2, 3], [8, 3, -1]],
                   step_confidence=[[0.9, 0.9, 0.9], [0.9, 0.2, 0.0]])
    answer = [1, 2, 3]
    assert model_chain(tr, answer, 0, 2, 0.5) == (2, 1)  # step 2 guessed 8, not 2
    assert model_chain(tr, answer, 1, 2, 0.5) == (2, 2)  # unsure of 3 (rightly): stops
    assert model_chain(tr, answer, 2, 2, 0.5) == (1, 1)  # the answer ends


def test_a_head_catches_up_on_every_token_of_the_last_pass() -> None:
    """A head drops its drafts' entries, so each pass feeds it the tokens kept last pass
    and the target's own (a draft model keeps its drafts and reads one)."""
    answer = list(range(10, 30))
    case = Case("code editing", [1, 2, 3], answer, 21.0, 2.0)
    right = [[*answer[j:], *[-1] * j] for j in range(4)]  # step j + 1 of the chain at i
    tr = HeadTrace([], [], 0.0, right, [[1.0] * len(answer)] * 4)
    flat, fed = interpolate({1: 1.0, 2: 1.0}), interpolate({1: 1.0, 2: 2.0})
    units, kept = replay(case, tr, Method("eagle", 4, model="eagle"), flat, fed)
    assert kept == [4, 4, 4, 4]
    # passes: catch-ups of 1, 5, 5, 5 tokens and 3 more steps each; 4 verifications
    assert units == (1 + 3) + 3 * (5 + 3) + 4 - 1
    units, _ = replay(case, Trace(answer, [1.0] * len(answer), 0.0),
                      Method("draft", 4, model="draft"), flat, fed)
    assert units == (1 + 3) + 3 * (2 + 3) + 4 - 1  # a draft model reads two a pass


def test_each_adaptive_method_gets_its_drafters_policies_from_the_factory() -> None:
    made: list[tuple[str, int]] = []

    def policy(drafter: str, max_gamma: int) -> DraftPolicy:
        made.append((drafter, max_gamma))
        return DraftPolicy.calibrated(1.0, {2: 1.1}, 0.05 * len(made), max_gamma)

    by_name = {m.name: m for m in methods([0.8], [0.3], policy)}
    hybrid = by_name["hybrid-eagle adaptive min_conf=0.3"].policy
    assert isinstance(hybrid, PartPolicies)
    assert hybrid.select(LOOKUP).max_gamma == 8
    assert hybrid.select(MODEL).max_gamma == HEAD_DEPTH
    assert by_name["draft adaptive min_conf=0.8"].policy.draft_cost is not None
    assert sorted(set(made)) == [("draft", 8), ("eagle", HEAD_DEPTH), ("ngram", 8),
                                 ("suffix", 8)]
