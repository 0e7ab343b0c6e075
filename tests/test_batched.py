"""Batched decoding: rows of several sequences in one forward give each row exactly what
stepping its sequence alone gives (the row promise across sequences)."""

from pathlib import Path

import pytest
import torch

from engine.cpu.forward import Forward, KVCache, forward_for
from tests.test_fastlinear import NATIVE, accelerated

PROMPTS = [[3, 17, 42, 99, 7, 250, 11, 60], [5, 6], [120, 121, 122, 9, 9]]


def caches_after_prompts(fwd: Forward) -> list[KVCache]:
    caches = [fwd.new_cache() for _ in PROMPTS]
    with torch.inference_mode():
        for prompt, cache in zip(PROMPTS, caches, strict=True):
            fwd.step(prompt, cache, 0, keep=False)
    return caches


def same_caches(a: KVCache, b: KVCache) -> None:
    assert len(a) == len(b)
    for x, y in zip(a.layers, b.layers, strict=True):
        assert torch.equal(x.keys, y.keys) and torch.equal(x.values, y.values)


@pytest.mark.parametrize("native", NATIVE)
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_a_batched_step_gives_each_sequence_what_its_own_step_gives(
    tmp_path: Path, kind: str, native: bool
) -> None:
    fwd = forward_for(accelerated(tmp_path, kind, native))
    assert (fwd.plan.backend == "native") == native
    together, alone = caches_after_prompts(fwd), caches_after_prompts(fwd)
    new = [[8], [30, 31, 32], [77, 1]]  # one decoding row, a verification of 3, one of 2
    rows = [1, 3, 1]
    batched = fwd.step_many(list(zip(new, together, strict=True)), rows, keep=True)
    for ids, cache, r, (got, features) in zip(new, alone, rows, batched, strict=True):
        with torch.inference_mode():
            want, hidden = fwd.step(ids, cache, r, keep=True)
        assert got.shape == want.shape and torch.equal(got, want)
        assert features is not None and hidden is not None and torch.equal(features, hidden)
    for a, b in zip(together, alone, strict=True):
        same_caches(a, b)


def test_batched_decoding_under_every_variant_matches_decoding_alone(
    tmp_path: Path, variant: str
) -> None:
    """Ten greedy steps of three sequences decoded together and one by one."""
    fwd = forward_for(accelerated(tmp_path, "qwen2", native=True))
    assert fwd.plan.variant == variant
    together, alone = caches_after_prompts(fwd), caches_after_prompts(fwd)
    tokens_together = [[p[-1]] for p in PROMPTS]
    tokens_alone = [[p[-1]] for p in PROMPTS]
    for _ in range(10):
        out = fwd.step_many([([t[-1]], c) for t, c in zip(tokens_together, together, strict=True)])
        for t, (logits, _) in zip(tokens_together, out, strict=True):
            t.append(int(logits[-1].argmax()))
        for t, cache in zip(tokens_alone, alone, strict=True):
            with torch.inference_mode():
                logits, _ = fwd.step([t[-1]], cache, 1, keep=False)
            t.append(int(logits[-1].argmax()))
    assert tokens_together == tokens_alone
    for a, b in zip(together, alone, strict=True):
        same_caches(a, b)


def test_a_batched_step_refuses_what_it_cannot_compute(tmp_path: Path) -> None:
    fwd = forward_for(accelerated(tmp_path, "llama", native=False))
    cache = fwd.new_cache()
    for steps, rows in (([([1], cache), ([2], cache)], None), ([([], cache)], None),
                        ([([1, 2], cache)], [3]), ([([1], cache)], [1, 1]), ([], None)):
        with pytest.raises(ValueError):
            fwd.step_many(steps, rows)
    assert len(cache) == 0
