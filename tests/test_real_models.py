"""The real models: the light one in every run, the Qwen appliance pair with ``-m slow``."""

import pytest

from engine.cpu import kernels
from engine.models import cache
from engine.protocol import ROLLING_WINDOW, Completion
from engine.spec.session import ChatEngine

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number, "
    "then show how to call it.",
    "Repeat this sentence exactly, then translate it to French: "
    "'The meeting with the finance team moves to Thursday at ten in room B.'",
    "Fix the bug in this code and show the corrected version:\n"
    "def mean(xs):\n    total = 0\n    for x in xs:\n        total += x\n"
    "    return total / len(x)\n",
]


def greedy_answer(engine: ChatEngine, prompt: str, method: str, max_tokens: int) -> Completion:
    messages = [{"role": "user", "content": prompt}]
    *_, done = engine.generate(messages, max_tokens=max_tokens, method=method)
    assert isinstance(done, Completion)
    return done


@pytest.mark.model
def test_light_model_greedy_lookup_drafting_is_token_identical(light_engine: ChatEngine) -> None:
    # the default load runs the GGUF's int4 codes: verification must equal decoding; our
    # kernels verify 8 tokens in one pass over the weights, torch's int4 kernel 4
    assert light_engine.target.accel == "int4+int8"
    assert light_engine.max_adaptive == (7 if kernels.available() else 3)
    accepted = 0
    for prompt in PROMPTS:
        plain = greedy_answer(light_engine, prompt, "off", 48)
        assert plain.text.strip()
        for method in ("ngram", "suffix"):
            spec = greedy_answer(light_engine, prompt, method, 48)
            assert spec.token_ids == plain.token_ids, (method, prompt)
            accepted += spec.stats.accepted
    assert accepted > 0  # the quoting and code prompts give the lookups something to copy


@pytest.mark.model
def test_light_model_greedy_speculation_equals_plain_under_each_kernel_variant(
    light_engine: ChatEngine, variant: str
) -> None:
    """Row independence holds in every variant, so verification equals decoding in each
    (variants may differ from one another in the last bits, not from themselves)."""
    for prompt in PROMPTS[1:]:
        plain = greedy_answer(light_engine, prompt, "off", 32)
        for method in ("ngram", "suffix"):
            assert greedy_answer(light_engine, prompt, method, 32).token_ids == plain.token_ids, (
                variant, method, prompt)


@pytest.mark.model
def test_light_model_follow_up_feeds_only_the_new_turn(light_engine: ChatEngine) -> None:
    first = [{"role": "user", "content": PROMPTS[0]}]
    done = greedy_answer(light_engine, PROMPTS[0], "off", 16)
    follow = [*first, {"role": "assistant", "content": done.text},
              {"role": "user", "content": "Now make it iterative."}]
    prompt = light_engine.encode(follow)
    assert light_engine.runner.common_prefix(prompt) > len(light_engine.encode(first))


@pytest.mark.model
def test_light_model_continues_a_cut_answer_as_a_larger_limit_would(
    light_engine: ChatEngine,
) -> None:
    for prompt in PROMPTS[:2]:  # code and a quote; the tiny-model tests cover the rest
        whole = greedy_answer(light_engine, prompt, "off", 40)
        first = greedy_answer(light_engine, prompt, "off", 16)
        assert first.finish_reason == "length"
        messages = [{"role": "user", "content": prompt},
                    {"role": "assistant", "content": first.text}]
        fitted = light_engine.fit(messages, continue_final=True)
        assert fitted.answer_ids == first.token_ids  # the answer's text tokenizes back
        for method in ("off", "ngram"):
            *_, rest = light_engine.generate(messages, max_tokens=24, method=method,
                                             continue_final=True)
            assert isinstance(rest, Completion)
            assert first.token_ids + rest.token_ids == whole.token_ids, (prompt, method)
            assert first.text + rest.text == whole.text
            assert rest.stats.cached_tokens >= len(fitted.ids) - len(first.token_ids) - 1


@pytest.mark.model
def test_light_model_long_chat_keeps_its_latest_turns_in_a_rolling_window(
    light_engine: ChatEngine,
) -> None:
    # the soak test's chat ran out of the light model's 8k context at question 179
    chat = [{"role": "system", "content": "You are ANVE."}]
    for i in range(200):
        chat += [{"role": "user", "content": f"Question {i}: explain speculative decoding."},
                 {"role": "assistant", "content": "A small draft proposes tokens. " * 8}]
    chat.append({"role": "user", "content": "And the last question?"})
    fitted = light_engine.fit(chat, overflow=ROLLING_WINDOW, reserve=512)
    assert len(fitted.ids) + 512 <= light_engine.target.max_context
    kept = [chat[0], *chat[1 + fitted.dropped_messages:]]
    assert fitted.ids == light_engine.encode(kept) and len(kept) > 100


@pytest.mark.model
def test_light_model_second_prepare_uses_the_cache(
    light_engine: ChatEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cache, "convert", pytest.fail)
    prepared = cache.prepare("smollm2-135m-instruct")
    assert (prepared.folder / "manifest.json").is_file()
    assert prepared.sha256 == light_engine.target.sha256


@pytest.mark.slow
def test_appliance_pair_greedy_speculation_is_token_identical() -> None:
    engine = ChatEngine.load("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct")
    assert engine.target.accel == engine.draft.accel == "int4+int8"  # type: ignore[union-attr]
    assert {"eagle", "hybrid-eagle"} <= set(engine.methods)  # the shipped head
    for prompt in PROMPTS[:2]:
        plain = greedy_answer(engine, prompt, "off", 32)
        for method in ("draft", "ngram", "suffix", "hybrid", "eagle", "hybrid-eagle"):
            assert greedy_answer(engine, prompt, method, 32).token_ids == plain.token_ids, method
