"""EAGLE heads on tiny random models: lossless drafting, cache rollback, head files."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from transformers import DynamicCache

from engine.cpu import kernels
from engine.cpu.forward import Stack
from engine.cpu.layers import Q4Linear
from engine.errors import HeadFileError, IncompatibleModelsError
from engine.heads.files import HeadInfo, load_head, save_head
from engine.heads.model import EagleHead, HeadConfig
from engine.spec.decoding import decode, prefill_drafter
from engine.spec.drafters.eagle import EagleDrafter, quantize_head
from engine.spec.runner import ModelRunner
from engine.spec.sampling import SamplingParams
from engine.spec.session import ChatEngine
from tests.stats import matches
from tests.test_decoding import _exact_two_token_distribution, prompts, run
from tests.tiny import tiny_loaded, tiny_model


def random_head(target: torch.nn.Module, seed: int = 0) -> EagleHead:
    torch.manual_seed(seed)
    head = EagleHead(HeadConfig.for_target(target.config, intermediate_size=32))
    with torch.no_grad():
        for p in head.parameters():
            p.mul_(4.0)  # a sharper, more confident head drafts longer chains
    return head.to(target.dtype).eval()


def head_info(target: torch.nn.Module, name: str, sha: str | None = None) -> HeadInfo:
    return HeadInfo(name, sha, int(target.config.vocab_size),
                    HeadConfig.for_target(target.config, intermediate_size=32))


@pytest.mark.parametrize(("kind", "draft_vocab"), [("llama", 64), ("qwen2", 64), ("llama", 40)])
def test_greedy_eagle_equals_greedy_plain(kind: str, draft_vocab: int) -> None:
    vocab = 64
    target = tiny_model(kind, vocab_size=vocab, seed=1, scale=4.0)
    drafter = EagleDrafter(random_head(target), target, min_confidence=0.0,
                           draft_vocab=draft_vocab, keep_ids=[vocab - 1])
    greedy_equals_plain(target, drafter, vocab)


def greedy_equals_plain(target: torch.nn.Module, drafter: EagleDrafter, vocab: int,
                        count: int = 4, n: int = 16) -> None:
    """Greedy decoding with ``drafter`` gives plain decoding's tokens on ``count`` prompts
    (draft lengths 2, 3, ..., first token first on every other one), and it drafted."""
    drafted = 0
    for i, prompt in enumerate(prompts(count, vocab, seed=10)):
        plain = run(target, prompt, n=n)
        steps = list(decode(ModelRunner(target), prompt, params=SamplingParams(),
                            max_new_tokens=n, max_context=256, drafter=drafter,
                            num_draft_tokens=2 + i, first_token_first=i % 2 == 1))
        assert [t for s in steps for t in s.tokens] == plain, (prompt, i)
        drafted += sum(s.drafted for s in steps)
    assert drafted > 0


@pytest.mark.skipif(not kernels.available(), reason="needs the native kernels (AVX2)")
def test_the_native_head_layer_computes_what_the_head_computes() -> None:
    target = tiny_model("llama", vocab_size=64, seed=1, scale=4.0, dtype=torch.float32)
    head = quantize_head(random_head(target, seed=5))
    stack = Stack(head.decoder)
    assert stack.plan.backend == "native", stack.plan.why_reference
    ours, theirs = stack.new_cache(), DynamicCache(config=head.decoder.config)
    torch.manual_seed(0)
    for rows in (5, 1, 3, 1):
        x = torch.randn(1, rows, int(target.config.hidden_size))
        with torch.inference_mode():
            a = stack(x[0].clone(), ours)  # [T, H]
            b = head.decoder(inputs_embeds=x, cache=theirs, use_cache=True).last_hidden_state
        assert torch.allclose(a, b[0], atol=1e-4, rtol=1e-4)
    assert len(ours) == theirs.get_seq_length() == 10


@pytest.mark.skipif(not kernels.available(), reason="needs the native kernels (AVX2)")
def test_greedy_eagle_on_the_fast_draft_path_equals_greedy_plain() -> None:
    vocab = 64
    target = tiny_model("qwen2", vocab_size=vocab, seed=1, scale=4.0, dtype=torch.float32)
    drafter = EagleDrafter(quantize_head(random_head(target, seed=2)), target,
                           min_confidence=0.0, draft_vocab=40, keep_ids=[vocab - 1],
                           int4_vocab=True)
    assert drafter.stack.plan.backend == "native" and isinstance(drafter.lm_head.frequent, Q4Linear)
    drafted = 0
    for i, prompt in enumerate(prompts(4, vocab, seed=11)):
        steps = list(decode(ModelRunner(target), prompt, params=SamplingParams(),
                            max_new_tokens=16, max_context=256, drafter=drafter,
                            num_draft_tokens=2 + i))
        assert [t for s in steps for t in s.tokens] == run(target, prompt, n=16), (prompt, i)
        drafted += sum(s.drafted for s in steps)
    assert drafted > 0


def test_head_cache_after_rollbacks_equals_a_fresh_head() -> None:
    target = tiny_model("llama", vocab_size=64, seed=3, scale=4.0)
    head = random_head(target, seed=4)
    used = EagleDrafter(head, target, min_confidence=0.0)
    runner = ModelRunner(target)
    params = SamplingParams(temperature=1.0, seed=0)
    context = [5, 6, 7, 8]
    steps = decode(runner, context, params=params, max_new_tokens=30, max_context=256,
                   drafter=used, num_draft_tokens=3)
    context += [t for step in steps for t in step.tokens]
    runner.sync(context[:-1])
    fresh = EagleDrafter(head, target, min_confidence=0.0)
    for drafter in (used, fresh):
        drafter.observe_hidden(runner.hidden)
    gen = torch.Generator()
    a = used.propose(context, 4, SamplingParams(), gen)
    b = fresh.propose(context, 4, SamplingParams(), gen)
    assert a.tokens == b.tokens and len(a) == 4
    assert len(used.kv.cache) == len(used.kv) == len(context) - 1


@pytest.mark.parametrize("draft_vocab", [5, 3])
def test_eagle_sampling_matches_plain_sampling(draft_vocab: int) -> None:
    vocab = 5
    target = tiny_model("llama", vocab_size=vocab, seed=11, scale=3.0)
    prompt = [1, 2, 3]
    exact = _exact_two_token_distribution(target, prompt)
    # a draft vocabulary of 3 ids never proposes ids 3 and 4: the target still emits them
    drafter = EagleDrafter(random_head(target, seed=12), target, min_confidence=0.0,
                           draft_vocab=draft_vocab)
    counts = torch.zeros(vocab * vocab)
    runner = ModelRunner(target)
    accepted = 0
    for seed in range(700):
        params = SamplingParams(temperature=1.0, seed=seed)
        steps = list(decode(runner, prompt, params=params, max_new_tokens=2, max_context=256,
                            drafter=drafter, num_draft_tokens=2))
        t1, t2 = [t for s in steps for t in s.tokens][:2]
        counts[t1 * vocab + t2] += 1
        accepted += sum(s.accepted for s in steps)
    assert accepted > 0
    assert matches(counts, exact)


def test_head_file_round_trip_and_engine_offers_eagle(tmp_path: Path) -> None:
    loaded = tiny_loaded("tiny-a", scale=4.0)
    head = random_head(loaded.model)
    path = save_head(head, head_info(loaded.model, "tiny-a"), tmp_path / "h.safetensors")
    back, info = load_head(path, "tiny-a", None, loaded.model)
    assert info.target == "tiny-a" and info.config == head.config
    for name, value in head.state_dict().items():
        torch.testing.assert_close(back.state_dict()[name], value.to(torch.float16).float())
    engine = ChatEngine(loaded, head=path)
    assert "eagle" in engine.methods
    messages = [{"role": "user", "content": "def add(a, b): quick brown fox"}]
    answers = [list(engine.generate(messages, max_tokens=30, method=m))[-1].token_ids
               for m in ("off", "eagle")]
    assert answers[0] == answers[1]


def test_head_for_another_target_is_refused(tmp_path: Path) -> None:
    loaded = tiny_loaded("tiny-a")
    path = save_head(random_head(loaded.model), head_info(loaded.model, "tiny-b"),
                     tmp_path / "h.safetensors")
    with pytest.raises(IncompatibleModelsError, match="trained for 'tiny-b'"):
        load_head(path, "tiny-a", None, loaded.model)
    with pytest.raises(IncompatibleModelsError):
        ChatEngine(loaded, head=path)
    other_sha = save_head(random_head(loaded.model), head_info(loaded.model, "tiny-a", "ab" * 32),
                          tmp_path / "s.safetensors")
    with pytest.raises(IncompatibleModelsError, match="SHA-256"):
        load_head(other_sha, "tiny-a", "cd" * 32, loaded.model)


def test_corrupt_or_foreign_head_file_gets_a_clear_error(tmp_path: Path) -> None:
    loaded = tiny_loaded("tiny-a")
    good = save_head(random_head(loaded.model), head_info(loaded.model, "tiny-a"),
                     tmp_path / "h.safetensors")
    truncated = tmp_path / "t.safetensors"
    truncated.write_bytes(good.read_bytes()[:-100])
    garbage = tmp_path / "g.safetensors"
    garbage.write_bytes(b"not a safetensors file at all")
    foreign = tmp_path / "f.safetensors"
    save_file({"x": torch.zeros(2)}, foreign, metadata={"format": "something else"})
    missing_weights = tmp_path / "m.safetensors"
    save_file({"fc.weight": torch.zeros(2)}, missing_weights,
              metadata=head_info(loaded.model, "tiny-a").metadata())
    for path in (truncated, garbage, foreign, missing_weights):
        with pytest.raises(HeadFileError, match="head"):
            load_head(path, "tiny-a", None, loaded.model)
    assert json.loads(head_info(loaded.model, "x").metadata()["info"])["target"] == "x"


def test_the_head_catches_up_with_the_prompt_before_the_first_pass() -> None:
    target = tiny_model("llama", vocab_size=64, seed=3, scale=4.0)
    drafter = EagleDrafter(random_head(target, seed=4), target, min_confidence=0.0)
    runner = ModelRunner(target)
    prompt = list(range(5, 35))
    runner.keep_hidden(True)
    runner.sync(prompt[:-1])
    assert drafter.unread(prompt) == len(prompt) - 1
    prefill_drafter(drafter, runner, prompt)
    assert len(drafter.kv.cache) == len(drafter.kv) == len(prompt) - 2  # all but the last feature
    assert drafter.unread(prompt) == 1 and len(drafter.kv) == len(prompt) - 2
    warm = drafter.propose(prompt, 3, SamplingParams(), torch.Generator())
    assert warm.catch_up == 1  # only the last position was left to feed
    fresh = EagleDrafter(drafter.head, target, min_confidence=0.0)
    fresh.observe_hidden(runner.hidden)
    assert fresh.unread(prompt) == len(prompt) - 1 and fresh.unread(prompt[:1]) == 0
    cold = fresh.propose(prompt, 3, SamplingParams(), torch.Generator())
    assert cold.tokens == warm.tokens and cold.catch_up == len(prompt) - 1
