"""The decoding loop on tiny random models: greedy equality, rollback, sampling."""

import random
from collections.abc import Sequence

import pytest
import torch

from engine.models.loading import LoadedModel
from engine.spec.decoding import decode, prefill_drafter
from engine.spec.drafters import Draft, Drafter
from engine.spec.drafters.draft_model import DraftModelDrafter
from engine.spec.drafters.hybrid import HybridDrafter
from engine.spec.drafters.ngram import NgramDrafter
from engine.spec.drafters.suffix import SuffixDrafter
from engine.spec.runner import ModelRunner
from engine.spec.sampling import SamplingParams
from tests.stats import matches
from tests.tiny import tiny_model

GREEDY = SamplingParams()


def loaded(model: torch.nn.Module, name: str = "m") -> LoadedModel:
    return LoadedModel(name, model, None, None, model.config.max_position_embeddings)


def run(target: torch.nn.Module, prompt: Sequence[int], drafter=None, k: int = 4,  # type: ignore[no-untyped-def]
        params: SamplingParams = GREEDY, n: int = 24, stop_ids: Sequence[int] = ()) -> list[int]:
    runner = ModelRunner(target)
    steps = decode(runner, prompt, params=params, max_new_tokens=n,
                   max_context=target.config.max_position_embeddings, stop_ids=stop_ids,
                   drafter=drafter, num_draft_tokens=k)
    return [t for step in steps for t in step.tokens]


def prompts(count: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        base = [rng.randrange(3, vocab) for _ in range(rng.randint(1, 12))]
        out.append(base * rng.randint(1, 3))  # repeats give the lookup drafters something to find
    return out


class FixedDrafter(Drafter):
    """Proposes a given list of tokens once (for controlled rejections)."""

    name = "fixed"

    def __init__(self, tokens: Sequence[int]) -> None:
        self.tokens = tuple(tokens)

    def propose(self, context, k, params, generator):  # type: ignore[no-untyped-def]
        out, self.tokens = self.tokens[:k], ()
        return Draft(out)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_greedy_speculative_equals_greedy_plain_for_every_drafter(kind: str) -> None:
    vocab = 64
    target = tiny_model(kind, vocab_size=vocab, seed=1, scale=4.0)
    other = tiny_model(kind, vocab_size=vocab, seed=2, scale=4.0)
    same = tiny_model(kind, vocab_size=vocab, seed=1, scale=4.0)
    accepted_any = False
    for i, prompt in enumerate(prompts(12, vocab, seed=10)):
        plain = run(target, prompt, n=20)
        drafters = [
            DraftModelDrafter(loaded(other), vocab),
            DraftModelDrafter(loaded(same), vocab),
            DraftModelDrafter(loaded(same), vocab, draft_vocab=40),  # never drafts ids >= 40
            DraftModelDrafter(loaded(same), vocab, window=5),  # reads the last 5 prompt tokens
            NgramDrafter(),
            SuffixDrafter([plain[: len(plain) // 2], prompt]),
            HybridDrafter({"suffix": SuffixDrafter([plain[: len(plain) // 3]]),
                           "draft": DraftModelDrafter(loaded(other), vocab)}),
        ]
        for drafter in drafters:
            k = 1 + (i % 5)
            assert run(target, prompt, drafter, k=k, n=20) == plain, (drafter.name, prompt, k)
        accepted_any = True
    assert accepted_any


def test_draft_model_reports_the_context_it_caught_up_on() -> None:
    vocab = 64
    model = tiny_model("llama", vocab_size=vocab, seed=1, scale=4.0)
    drafter = DraftModelDrafter(loaded(model), vocab, min_confidence=0.0)
    params, generator = SamplingParams(), torch.Generator()
    prompt = [5, 6, 7, 8, 5, 6]
    first = drafter.propose(prompt, 3, params, generator)
    assert len(first) == 3 and first.catch_up == len(prompt)  # nothing was cached yet
    context = [*prompt, *first.tokens, 1]  # all accepted: the last draft and the new token
    second = drafter.propose(context, 3, params, generator)
    assert second.catch_up == 2
    context += [second.tokens[0], (second.tokens[1] + 1) % vocab]  # one kept, one corrected
    assert drafter.propose(context, 3, params, generator).catch_up == 1
    context += [1, 2, 3, 4]  # four tokens decoded without it: all four are new to it
    assert drafter.propose(context, 3, params, generator).catch_up == 4


@pytest.mark.parametrize("window", [None, 8])
def test_the_draft_model_says_beforehand_how_much_it_will_read(window: int | None) -> None:
    """``unread`` predicts each propose's catch-up (its last token included), whether the
    conversation goes on, another one comes, or a parked one returns, and moves nothing."""
    drafter = DraftModelDrafter(loaded(tiny_model("llama", vocab_size=64, seed=2)), 64,
                                min_confidence=0.0, window=window)
    params, generator, draws = SamplingParams(), torch.Generator(), random.Random(5)
    conversations = [[3 + (i * 7 + c) % 60 for i in range(20)] for c in range(3)]
    for _ in range(30):
        c = draws.randrange(3)
        context = conversations[c]
        state = (drafter.start, list(drafter.runner.ids), len(drafter.runner.parked))
        expected = drafter.unread(context)
        assert state == (drafter.start, drafter.runner.ids, len(drafter.runner.parked))
        if draws.random() < 0.3:  # the prompt read before the first pass
            prefill_drafter(drafter, ModelRunner(tiny_model("llama", vocab_size=64)), context)
            assert drafter.unread(context) == 1
            expected = 1
        draft = drafter.propose(context, 3, params, generator)
        assert draft.catch_up == expected
        kept = draws.randrange(len(draft.tokens) + 1)  # some drafts kept, then a new token
        conversations[c] = [*context, *draft.tokens[:kept], draws.randrange(3, 60),
                            *[draws.randrange(3, 60) for _ in range(draws.choice([0, 2, 12]))]]
    fresh = DraftModelDrafter(drafter.loaded, 64, window=window)
    assert fresh.unread(conversations[0]) == min(len(conversations[0]), window or 10**9)


def test_draft_of_different_vocab_size_is_padded() -> None:
    target = tiny_model("llama", vocab_size=64, seed=1, scale=4.0)
    draft = tiny_model("llama", vocab_size=60, seed=1, scale=4.0)
    prompt = [5, 6, 7, 8, 5, 6]
    assert run(target, prompt, DraftModelDrafter(loaded(draft), 64)) == run(target, prompt)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_rollback_gives_the_logits_of_a_fresh_forward(kind: str) -> None:
    target = tiny_model(kind, vocab_size=64, seed=3, scale=4.0)
    prompt = [4, 9, 13, 22, 7]
    plain = run(target, prompt, n=1)
    wrong = [(plain[0] + 1) % 64, 5, 6, 7]  # the first draft token is rejected
    runner = ModelRunner(target)
    steps = decode(runner, prompt, params=GREEDY, max_new_tokens=8, max_context=256,
                   drafter=FixedDrafter(wrong), num_draft_tokens=4)
    step = next(steps)
    assert step.accepted == 0 and step.tokens == (plain[0],)
    accepted_prefix = [*prompt, *step.tokens]
    assert runner.ids == accepted_prefix[:-1]
    logits = runner.forward([accepted_prefix[-1]])[-1]
    with torch.no_grad():
        fresh = target(torch.tensor([accepted_prefix])).logits[0, -1]
    torch.testing.assert_close(logits, fresh, rtol=0, atol=1e-10)


def test_partial_acceptance_keeps_the_accepted_drafts_in_the_cache() -> None:
    target = tiny_model("llama", vocab_size=64, seed=4, scale=4.0)
    prompt = [4, 9, 13]
    plain = run(target, prompt, n=4)
    runner = ModelRunner(target)
    draft = [plain[0], plain[1], (plain[2] + 1) % 64]
    steps = decode(runner, prompt, params=GREEDY, max_new_tokens=8, max_context=256,
                   drafter=FixedDrafter(draft), num_draft_tokens=3)
    step = next(steps)
    assert step.accepted == 2 and list(step.tokens) == plain[:3]
    assert step.from_draft == (True, True, False)
    assert runner.ids == [*prompt, plain[0], plain[1]]


def test_stop_ids_end_the_answer_inside_a_pass() -> None:
    target = tiny_model("llama", vocab_size=64, seed=5, scale=4.0)
    prompt = [3, 4, 5, 3, 4, 5, 3, 4]
    plain = run(target, prompt, n=12)
    stop = plain[5]
    cut = plain[: plain.index(stop)]
    for drafter in (None, NgramDrafter(), SuffixDrafter([plain])):
        assert run(target, prompt, drafter, n=12, stop_ids=[stop]) == cut


def test_max_new_tokens_and_context_limit_are_respected() -> None:
    target = tiny_model("llama", vocab_size=64, seed=6, scale=4.0, max_positions=40)
    prompt = [7, 8, 9] * 10
    for drafter in (None, SuffixDrafter([list(range(3, 60))])):
        assert len(run(target, prompt, drafter, n=5)) == 5
        tokens = run(target, prompt, drafter, n=100)
        assert len(prompt) + len(tokens) == 40


def test_sampling_is_seeded_and_deterministic() -> None:
    target = tiny_model("llama", vocab_size=64, seed=7)
    draft = tiny_model("llama", vocab_size=64, seed=8)
    params = SamplingParams(temperature=1.0, top_p=0.9, top_k=20, seed=1234)
    prompt = [5, 6, 7]
    a = run(target, prompt, DraftModelDrafter(loaded(draft), 64), params=params)
    b = run(target, prompt, DraftModelDrafter(loaded(draft), 64), params=params)
    c = run(target, prompt, DraftModelDrafter(loaded(draft), 64),
            params=SamplingParams(temperature=1.0, top_p=0.9, top_k=20, seed=99))
    assert a == b
    assert a != c


def test_a_seeded_answer_is_the_same_whatever_drafts_it() -> None:
    """The seed fixes the tokens; drafters and draft lengths only change the passes."""
    target = tiny_model("llama", vocab_size=64, seed=7, scale=3.0)
    near = DraftModelDrafter(loaded(tiny_model("llama", vocab_size=64, seed=7, scale=3.0)), 64,
                             min_confidence=0.0)
    far = DraftModelDrafter(loaded(tiny_model("llama", vocab_size=64, seed=8)), 64,
                            min_confidence=0.0)
    params = SamplingParams(temperature=1.0, top_p=0.95, seed=31)
    prompt = [5, 6, 7, 5, 6]
    plain = run(target, prompt, params=params, n=30)
    accepted = 0
    for drafter, k in ((near, 1), (near, 4), (far, 3), (NgramDrafter(), 3)):
        steps = list(decode(ModelRunner(target), prompt, params=params, max_new_tokens=30,
                            max_context=256, drafter=drafter, num_draft_tokens=k))
        assert [t for s in steps for t in s.tokens] == plain, (drafter, k)
        accepted += sum(s.accepted for s in steps)
    assert accepted > 0  # the near drafter's draws coincide with the target's
    other = run(target, prompt, params=SamplingParams(temperature=1.0, top_p=0.95, seed=32),
                n=30)
    assert other != plain


def _exact_two_token_distribution(model: torch.nn.Module, prompt: list[int]) -> torch.Tensor:
    """P(t1, t2 | prompt) for a small vocabulary, flattened to ``[V * V]``."""
    with torch.no_grad():
        p1 = model(torch.tensor([prompt])).logits[0, -1].softmax(-1)  # [V]
        vocab = p1.shape[0]
        seqs = torch.tensor([[*prompt, t] for t in range(vocab)])
        p2 = model(seqs).logits[:, -1].softmax(-1)  # [V, V]
    return (p1[:, None] * p2).reshape(-1)


def _drafters(target_vocab: int, draft_vocab: int) -> list[tuple[str, Drafter]]:
    """A draft model over ``draft_vocab`` of the ids, and a hybrid of it with a lookup that
    drafts (q one-hot) after "2 3" and "4 5"."""
    draft = tiny_model("llama", vocab_size=target_vocab, seed=12, scale=3.0)
    drafter = DraftModelDrafter(loaded(draft), target_vocab, draft_vocab=draft_vocab)
    lookup = SuffixDrafter([[2, 3, 4, 5, 6], [4, 5, 1, 7]], key_len=2)
    return [("draft", drafter),
            ("hybrid", HybridDrafter({"suffix": lookup, "draft": drafter}, min_lookup=1))]


@pytest.mark.parametrize("draft_vocab", [8, 5])
def test_speculative_sampling_matches_plain_sampling_end_to_end(draft_vocab: int) -> None:
    """Leviathan's acceptance test (an unseeded answer, here with a seeded generator).
    Plain sampling, which no draft vocabulary touches, is checked once (with the draft's
    full vocabulary); a seeded answer is checked draw by draw in the next test."""
    vocab = 8
    target = tiny_model("llama", vocab_size=vocab, seed=11, scale=3.0)
    prompt = [1, 2, 3]
    exact = _exact_two_token_distribution(target, prompt)
    methods: list[tuple[str, Drafter | None]] = list(_drafters(vocab, draft_vocab))
    if draft_vocab == vocab:
        methods.insert(0, ("off", None))
    counts = {m: torch.zeros(vocab * vocab) for m, _ in methods}
    runner = ModelRunner(target)
    for method, d in methods:
        for seed in range(1500):
            steps = decode(runner, prompt, params=SamplingParams(temperature=1.0),
                           max_new_tokens=2, max_context=256, drafter=d, num_draft_tokens=2,
                           generator=torch.Generator().manual_seed(seed))
            t1, t2 = [t for s in steps for t in s.tokens][:2]
            counts[method][t1 * vocab + t2] += 1
    for method, seen in counts.items():
        assert matches(seen, exact), method


def test_seeded_sampling_keeps_the_target_distribution_and_speculation_keeps_every_draw(
) -> None:
    """A seeded answer's draws follow the target's distribution, and each drafter, over the
    full or a trimmed draft vocabulary, gives the very tokens plain decoding gives for the
    same seed: the same distribution, checked draw by draw rather than in counts."""
    vocab, n = 8, 3
    target = tiny_model("llama", vocab_size=vocab, seed=11, scale=3.0)
    prompt = [1, 2, 3]
    runner = ModelRunner(target)

    def answer(seed: int, drafter: Drafter | None) -> tuple[list[int], int, int]:
        steps = list(decode(runner, prompt, params=SamplingParams(temperature=1.0, seed=seed),
                            max_new_tokens=n, max_context=256, drafter=drafter,
                            num_draft_tokens=2, generator=torch.Generator().manual_seed(seed)))
        return ([t for s in steps for t in s.tokens], sum(s.drafted for s in steps),
                sum(s.accepted for s in steps))

    plain = [answer(seed, None)[0] for seed in range(1500)]
    counts = torch.zeros(vocab * vocab)
    for t1, t2, *_ in plain:
        counts[t1 * vocab + t2] += 1
    assert matches(counts, _exact_two_token_distribution(target, prompt))
    for draft_vocab in (vocab, 5):
        for method, drafter in _drafters(vocab, draft_vocab):
            drafted = accepted = 0
            for seed in range(300):
                tokens, d, a = answer(seed, drafter)
                assert tokens == plain[seed], (method, draft_vocab, seed)
                drafted, accepted = drafted + d, accepted + a
            assert 0 < accepted < drafted, (method, draft_vocab)  # some kept, some rejected


def test_first_token_first_lets_the_drafter_read_the_prompt_after_the_first_token() -> None:
    target = tiny_model("llama", vocab_size=64, seed=1, scale=4.0)
    drafter = DraftModelDrafter(loaded(tiny_model("llama", vocab_size=64, seed=2)), 64,
                                min_confidence=0.0)
    prompt = prompts(1, 64, seed=3)[0] * 6  # [30]
    steps = decode(ModelRunner(target), prompt, params=GREEDY, max_new_tokens=20,
                   max_context=256, drafter=drafter, num_draft_tokens=3, first_token_first=True)
    first = next(steps)
    assert first.drafted == 0 and len(first.tokens) == 1 and first.drafter_prefill_s == 0.0
    assert drafter.runner.ids == []  # nothing read yet: the first token did not wait for it
    second = next(steps)
    assert second.drafted > 0 and second.drafter_prefill_s > 0.0
    assert drafter.runner.ids[:len(prompt)] == prompt  # the prompt, then the first token
    rest = [t for s in steps for t in s.tokens]
    assert [*first.tokens, *second.tokens, *rest] == run(target, prompt, n=20)


def test_first_token_first_keeps_every_seeded_draw() -> None:
    """The first token comes before the drafter has read the prompt; every token of a seeded
    answer is still the one plain decoding draws (so the target's distribution: the seeded
    sampling test counts plain's draws)."""
    vocab = 5
    target = tiny_model("llama", vocab_size=vocab, seed=11, scale=3.0)
    draft = tiny_model("llama", vocab_size=vocab, seed=12, scale=3.0)
    prompt = [1, 2, 3]
    drafter = DraftModelDrafter(loaded(draft), vocab)
    runner = ModelRunner(target)
    drafted = 0
    for seed in range(300):
        params = SamplingParams(temperature=1.0, seed=seed)
        plain = [t for s in decode(runner, prompt, params=params, max_new_tokens=3,
                                   max_context=256) for t in s.tokens]
        steps = list(decode(runner, prompt, params=params, max_new_tokens=3, max_context=256,
                            drafter=drafter, num_draft_tokens=2, first_token_first=True))
        assert [t for s in steps for t in s.tokens] == plain, seed
        assert steps[0].drafted == 0  # the second token comes from a speculative pass
        drafted += steps[1].drafted
    assert drafted > 200


def test_a_draft_model_catches_up_with_the_prompt_before_the_first_pass() -> None:
    target = tiny_model("llama", vocab_size=64, seed=1, scale=4.0)
    drafter = DraftModelDrafter(loaded(tiny_model("llama", vocab_size=64, seed=2)), 64,
                                min_confidence=0.0)
    prompt = prompts(1, 64, seed=3)[0] * 6  # [30] a long prompt
    runner = ModelRunner(target)
    runner.sync(prompt[:-1])
    prefill_drafter(drafter, runner, prompt)
    assert drafter.runner.ids == prompt[:-1]
    fed: list[int] = []
    forward = drafter.runner.forward
    drafter.runner.forward = lambda ids, rows=1, head=None: (
        fed.append(len(ids)) or forward(ids, rows, head))
    drafter.propose(prompt, 3, SamplingParams(), torch.Generator())
    assert fed == [1, 1, 1]  # the prompt's last token, then one per further draft token


def test_the_draft_model_reads_a_window_of_a_long_prompt() -> None:
    drafter = DraftModelDrafter(loaded(tiny_model("llama", vocab_size=64, seed=2)), 64,
                                min_confidence=0.0, window=8)
    prompt = list(range(3, 33))  # [30]
    prefill_drafter(drafter, ModelRunner(tiny_model("llama", vocab_size=64, seed=1)), prompt)
    assert drafter.runner.ids == prompt[22:29]  # the last 8 but the one propose feeds
    params, generator = SamplingParams(), torch.Generator()
    first = drafter.propose(prompt, 3, params, generator)
    assert first.catch_up == 1 and drafter.start == 22
    context = [*prompt, *first.tokens, 40]  # the drafts accepted: the window keeps its start
    assert drafter.propose(context, 3, params, generator).catch_up == 2
    assert drafter.start == 22 and drafter.runner.ids[:4] == prompt[22:26]
    context += list(range(5, 20))  # a next message longer than the window: read its end only
    assert drafter.propose(context, 3, params, generator).catch_up == 8
    assert drafter.start == len(context) - 8 and drafter.runner.ids[:8] == context[-8:]
    with pytest.raises(ValueError, match="window"):
        DraftModelDrafter(loaded(tiny_model("llama", vocab_size=64, seed=2)), 64, window=0)


def test_the_draft_model_swaps_back_the_cache_of_a_conversation_that_returns() -> None:
    drafter = DraftModelDrafter(loaded(tiny_model("llama", vocab_size=64, seed=2)), 64,
                                min_confidence=0.0, window=8)
    params, generator = SamplingParams(), torch.Generator()
    a, b = list(range(3, 33)), list(range(33, 63))  # [30] each, nothing shared
    first = drafter.propose(a, 2, params, generator)
    assert first.catch_up == 8 and drafter.start == 22
    assert drafter.propose(b, 2, params, generator).catch_up == 8 and drafter.start == 22
    assert [p.ids[:8] for p in drafter.runner.parked] == [a[22:]]  # a waits parked
    back = [*a, *first.tokens, 5]  # a's conversation goes on
    assert drafter.propose(back, 2, params, generator).catch_up == 2  # not its 8 again
    assert drafter.start == 22 and drafter.runner.parked[0].ids[:8] == b[22:]
