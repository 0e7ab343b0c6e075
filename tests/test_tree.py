"""Draft trees: branching drafters, one-pass tree verification, lossless either way."""

from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from engine.cpu.quantize import accelerate
from engine.spec.decoding import decode
from engine.spec.drafters import Draft, Drafter
from engine.spec.drafters.draft_model import DraftModelDrafter
from engine.spec.drafters.eagle import EagleDrafter
from engine.spec.drafters.tree import Level, branch, choose
from engine.spec.runner import ModelRunner
from engine.spec.sampling import SamplingParams
from tests.test_decoding import loaded, prompts, run
from tests.test_eagle import random_head
from tests.test_fastlinear import NATIVE, accelerated
from tests.tiny import tiny_model

GREEDY = SamplingParams()


def test_choose_offers_the_next_likeliest_tokens_when_greedy() -> None:
    logits = torch.tensor([0.0, 3.0, 1.0, 2.0])
    level = choose(logits, GREEDY, torch.Generator(), alternatives=2)
    assert level.token == 1 and [t for t, _ in level.alternatives] == [3, 2]
    probs = logits.softmax(-1)
    assert level.confidence == pytest.approx(float(probs[1]))
    assert level.alternatives[0][1] == pytest.approx(float(probs[3]))


def test_choose_draws_alternatives_without_replacement_when_sampling() -> None:
    params = SamplingParams(temperature=1.0)
    for seed in range(20):
        level = choose(torch.tensor([0.0, 0.0, 5.0]), params, torch.Generator().manual_seed(seed),
                       alternatives=3)
        drawn = [level.token, *(t for t, _ in level.alternatives)]
        assert sorted(drawn) == [0, 1, 2] and level.q is not None  # all three, once each


def test_branch_keeps_the_chain_and_adds_the_likeliest_alternatives_as_leaves() -> None:
    levels = [Level(5, 0.6, None, [(7, 0.3)]), Level(6, 0.9, None, [(8, 0.05)]),
              Level(9, 0.5, None, [(4, 0.4)])]
    draft = branch(levels, budget=2, min_chance=0.1)
    # chances: 7 -> 0.3, 8 -> 0.6 * 0.05 = 0.03 (too low), 4 -> 0.6 * 0.9 * 0.4 = 0.216
    assert draft.tokens == (5, 6, 9, 7, 4)
    assert draft.parents == (-1, 0, 1, -1, 1)
    assert draft.depth == 3 and draft.main_chain().tokens == (5, 6, 9)
    assert branch(levels, budget=1, min_chance=0.1).tokens == (5, 6, 9, 7)
    assert branch(levels, budget=0, min_chance=0.0) == Draft((5, 6, 9))


class TreeOnce(Drafter):
    """Proposes one given tree on its first call, then nothing."""

    name = "tree"

    def __init__(self, tokens: Sequence[int], parents: Sequence[int]) -> None:
        self.draft: Draft | None = Draft(tuple(tokens), None, tuple(parents))

    def propose(self, context, k, params, generator):  # type: ignore[no-untyped-def]
        out, self.draft = self.draft, None
        return out or Draft(())


@pytest.mark.parametrize("native", NATIVE)
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_the_right_branch_of_a_tree_is_accepted_and_the_answer_is_unchanged(
    tmp_path: Path, kind: str, native: bool
) -> None:
    target = accelerated(tmp_path, kind, native)
    prompt = [3, 17, 42, 99, 7]
    plain = run(target, prompt, n=12)
    wrong = (plain[0] + 1) % 320
    # the chain's first guess is wrong; its sibling is right and so is that one's child
    drafter = TreeOnce([wrong, plain[0], plain[1], wrong], [-1, -1, 1, 1])
    runner = ModelRunner(target)
    steps = list(decode(runner, prompt, params=GREEDY, max_new_tokens=12, max_context=128,
                        drafter=drafter, num_draft_tokens=4))
    assert steps[0].tokens == tuple(plain[:3]) and steps[0].accepted == 2
    assert [t for s in steps for t in s.tokens] == plain


@pytest.mark.parametrize("native", NATIVE)
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_greedy_tree_drafting_equals_greedy_plain(tmp_path: Path, kind: str, native: bool
                                                  ) -> None:
    target = accelerated(tmp_path, kind, native)
    vocab = int(target.config.vocab_size)
    draft = tiny_model(kind, vocab_size=vocab, seed=2, scale=4.0, dtype=torch.float32)
    drafters = [
        DraftModelDrafter(loaded(draft), vocab, min_confidence=0.0, branches=3, min_branch=0.0),
        EagleDrafter(random_head(target), target, min_confidence=0.0, branches=3,
                     min_branch=0.0),
    ]
    for i, prompt in enumerate(prompts(3, vocab, seed=5)):
        plain = run(target, prompt, n=12)
        for drafter in drafters:
            steps = list(decode(ModelRunner(target), prompt, params=GREEDY, max_new_tokens=12,
                                max_context=128, drafter=drafter, num_draft_tokens=2 + i))
            assert [t for s in steps for t in s.tokens] == plain, (drafter.name, i)
            assert max(s.drafted for s in steps) > 2 + i  # the trees had branches


@pytest.mark.parametrize("native", NATIVE)
def test_a_tree_too_big_for_one_step_is_verified_as_its_chain(tmp_path: Path, native: bool
                                                                    ) -> None:
    target = accelerated(tmp_path, "qwen2", native)
    prompt = [3, 17, 42, 99, 7]
    plain = run(target, prompt, n=8)
    chain = plain[:3]
    tokens = [*chain, *range(40, 53)]  # 16 nodes: 3 on the chain, 13 leaves under the root
    drafter = TreeOnce(tokens, [-1, 0, 1, *[-1] * 13])
    steps = list(decode(ModelRunner(target), prompt, params=GREEDY, max_new_tokens=8,
                        max_context=128, drafter=drafter, num_draft_tokens=4))
    assert steps[0].drafted == 3 and steps[0].accepted == 3  # the chain alone was verified
    assert [t for s in steps for t in s.tokens] == plain


def test_a_float64_model_on_the_reference_verifies_trees_too() -> None:
    vocab = 64
    target = tiny_model("llama", vocab_size=vocab, seed=1, scale=4.0)  # float64, nn.Linear
    assert ModelRunner(target).model_forward.plan.backend == "reference"
    other = tiny_model("llama", vocab_size=vocab, seed=2, scale=4.0)
    drafter = DraftModelDrafter(loaded(other), vocab, branches=3, min_branch=0.0)
    for prompt in prompts(3, vocab, seed=7):
        assert run(target, prompt, drafter, k=3, n=12) == run(target, prompt, n=12)


def test_tree_sampling_keeps_every_seeded_draw() -> None:
    """Trees from a draft model and from an EAGLE head, verified with sampling: each token
    of a seeded answer is the one plain decoding draws for that seed (whose draws follow the
    target's distribution: test_decoding counts them), branches or not."""
    vocab = 6
    target = tiny_model("llama", vocab_size=vocab, seed=11, scale=2.0, dtype=torch.float32)
    accelerate(target, None, "fp32")
    draft = tiny_model("llama", vocab_size=vocab, seed=12, scale=2.0, dtype=torch.float32)
    prompt = [1, 2, 3]
    runner = ModelRunner(target)
    drafters = [
        DraftModelDrafter(loaded(draft), vocab, min_confidence=0.0, branches=2, min_branch=0.0),
        EagleDrafter(random_head(target, seed=12), target, min_confidence=0.0, branches=2,
                     min_branch=0.0),
    ]
    seeds = range(250)
    plain = {seed: [t for s in decode(runner, prompt, max_new_tokens=4, max_context=64,
                                      params=SamplingParams(temperature=1.0, seed=seed))
                    for t in s.tokens] for seed in seeds}
    for drafter in drafters:
        branched = accepted = 0
        for seed in seeds:
            params = SamplingParams(temperature=1.0, seed=seed)
            steps = list(decode(runner, prompt, params=params, max_new_tokens=4,
                                max_context=64, drafter=drafter, num_draft_tokens=2))
            assert [t for s in steps for t in s.tokens] == plain[seed], (drafter.name, seed)
            branched += steps[0].drafted > 2
            accepted += sum(s.accepted for s in steps)
        assert branched > 125 and accepted > 0, drafter.name
