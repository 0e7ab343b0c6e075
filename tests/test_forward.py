"""The engine's forward pass: its torch reference computes what transformers' forward
computes, the native back end what the reference computes (within float32 rounding), and
either gives each row of a k-row step exactly what one-row steps give it."""

from pathlib import Path

import pytest
import torch
from transformers import DynamicCache, GPT2Config, GPT2LMHeadModel, Qwen2Config, Qwen2ForCausalLM

from engine.cpu import forward as forward_mod
from engine.cpu import kernels
from engine.cpu.forward import (
    READ_ROWS,
    TREE_ROWS,
    Forward,
    KVCache,
    UnsupportedModelError,
    forward_for,
)
from engine.spec.runner import ModelRunner
from tests.test_fastlinear import NATIVE, accelerated
from tests.tiny import tiny_model

PROMPT = [3, 17, 42, 99, 7, 250, 11, 60]
STEPS = ([5], [77, 300, 12], [9, 100, 42, 8, 1], [4])


def native_forward(tmp_path: Path, kind: str) -> tuple[torch.nn.Module, Forward]:
    if not kernels.available():
        pytest.skip("native kernels need AVX2, FMA, F16C and a C++ compiler")
    model = accelerated(tmp_path, kind, native=True)
    fwd = forward_for(model)
    assert fwd.plan.backend == "native", fwd.plan.why_reference
    return model, fwd


def close(a: torch.Tensor, b: torch.Tensor, atol: float) -> None:
    torch.testing.assert_close(a, b, rtol=0, atol=atol)


def near(a: torch.Tensor, b: torch.Tensor, share: float = 0.03) -> None:
    """Within ``share`` of ``b``'s largest magnitude: native and reference differ in the
    last float bits (norm sums, ``exp``), which now and then moves an activation across an
    int8 rounding step of the quantized layers (seen: up to 1.5 % of the largest logit)."""
    worst = float((a - b).abs().max())
    assert worst <= share * float(b.abs().max()), f"{worst} > {share} of {float(b.abs().max())}"


@pytest.mark.parametrize(("kind", "dtype", "atol"), [
    ("llama", torch.float64, 1e-6), ("qwen2", torch.float64, 1e-6),
    ("llama", torch.float32, 1e-4), ("qwen2", torch.float32, 1e-4)])
def test_the_reference_computes_what_transformers_forward_computes(
    kind: str, dtype: torch.dtype, atol: float
) -> None:
    model = tiny_model(kind, dtype=dtype)
    fwd = forward_for(model)
    assert fwd.plan.backend == "reference" and fwd.plan.why_reference
    ours, theirs = fwd.new_cache(), DynamicCache(config=model.config)
    with torch.inference_mode():
        logits, hidden = fwd.step(PROMPT, ours, len(PROMPT), keep=True)
        out = model(input_ids=torch.tensor([PROMPT]), cache=theirs, output_hidden_states=True)
        close(logits, out.logits[0], atol)
        assert hidden is not None
        close(hidden, out.hidden_states[-1][0], atol)
        for new in STEPS:
            logits, hidden = fwd.step(new, ours, 1, keep=False)
            out = model(input_ids=torch.tensor([new]), cache=theirs, logits_to_keep=1)
            close(logits, out.logits[0], atol)
            assert hidden is None
        for mine, theirs_layer in zip(ours.layers, theirs.layers, strict=True):
            close(mine.keys, theirs_layer.keys[0], atol)
            close(mine.values, theirs_layer.values[0], atol)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_the_native_back_end_computes_what_the_reference_computes(
    tmp_path: Path, kind: str
) -> None:
    model, native = native_forward(tmp_path, kind)
    reference = forward_for(model)
    reference.decoder.native = None  # the same layers through the torch reference
    ours, theirs = native.new_cache(), reference.new_cache()
    with torch.inference_mode():
        for new in (PROMPT, *STEPS):
            a, ha = native.step(new, ours, len(new), keep=True)
            b, hb = reference.step(new, theirs, len(new), keep=True)
            near(a, b)
            assert ha is not None and hb is not None
            near(ha, hb)
    for x, y in zip(ours.layers, theirs.layers, strict=True):
        near(x.keys, y.keys)
        near(x.values, y.values)


NEW = [9, 100, 42, 8, 1, 77, 5, 64, 3, 31, 12, 90, 2, 55, 18, 70]


def rows_and_singles(fwd: Forward, new: list[int], keep: bool = False
                     ) -> tuple[torch.Tensor, torch.Tensor, KVCache, KVCache]:
    together, single = fwd.new_cache(), fwd.new_cache()
    with torch.inference_mode():
        for cache in (together, single):
            fwd.step(PROMPT, cache, 0, keep=False)
        rows, _ = fwd.step(new, together, len(new), keep)  # [count, V]
        apart = torch.cat([fwd.step([t], single, 1, keep)[0] for t in new])
    return rows, apart, together, single


def same_caches(a: KVCache, b: KVCache) -> None:
    assert len(a) == len(b)
    for x, y in zip(a.layers, b.layers, strict=True):
        assert torch.equal(x.keys, y.keys) and torch.equal(x.values, y.values)


@pytest.mark.parametrize(("kind", "count"), [("llama", 6), ("qwen2", 6), ("llama", 16)])
def test_a_native_k_row_step_gives_each_row_what_one_row_steps_give(
    tmp_path: Path, kind: str, count: int, variant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under every kernel variant; 16 rows: one pass over the weights in AVX-512's."""
    monkeypatch.setattr(forward_mod, "MIN_CAPACITY", 10)  # the buffers grow during the test
    _, fwd = native_forward(tmp_path, kind)
    assert fwd.plan.variant == variant
    rows, apart, together, single = rows_and_singles(fwd, NEW[:count])
    assert torch.equal(rows, apart)
    same_caches(together, single)


def test_a_prompt_read_in_native_chunks_of_any_size_leaves_the_same_cache(
    tmp_path: Path, variant: str
) -> None:
    """A read of more than :data:`READ_ROWS` positions (several chunks) against one-row
    steps and against an uneven split."""
    _, fwd = native_forward(tmp_path, "qwen2")
    ids = [(7 * i * i + 3 * i + 11) % 317 + 3 for i in range(READ_ROWS + 9)]
    whole, ones, split = fwd.new_cache(), fwd.new_cache(), fwd.new_cache()
    with torch.inference_mode():
        logits, hidden = fwd.read(ids, whole, 3, keep=True)
        singles = [fwd.step([t], ones, 1, keep=True) for t in ids]
        fwd.read(ids[:5], split, 0, keep=False)
        fwd.read(ids[5:], split, 0, keep=False)
    assert torch.equal(logits, torch.cat([s[0] for s in singles[-3:]]))
    assert hidden is not None and torch.equal(hidden, torch.cat([s[1] for s in singles]))
    same_caches(whole, ones)
    same_caches(whole, split)


def test_the_reference_on_row_independent_layers_is_row_invariant(tmp_path: Path) -> None:
    """torch's int4/int8 kernels (no native layers): the reference keeps the promise too."""
    model = accelerated(tmp_path, "llama", native=False)
    fwd = forward_for(model)
    assert fwd.plan.backend == "reference" and fwd.plan.row_invariant
    rows, apart, together, single = rows_and_singles(fwd, NEW[:5], keep=True)
    assert torch.equal(rows, apart)
    same_caches(together, single)


def test_the_native_step_follows_replaced_weights_and_cropped_caches(tmp_path: Path) -> None:
    model, fwd = native_forward(tmp_path, "qwen2")
    cache = fwd.new_cache()
    with torch.inference_mode():
        fwd.step(PROMPT, cache, 0, keep=False)
        first, _ = fwd.step([5, 6], cache, 2, keep=False)
        cache.crop(len(PROMPT))
        again, _ = fwd.step([5, 6], cache, 2, keep=False)
        assert torch.equal(first, again) and len(cache) == len(PROMPT) + 2
        down = model.model.layers[0].mlp.down_proj
        name = down.BUFFERS[0]
        down._buffers[name] = torch.zeros_like(down._buffers[name])  # a new array
        cache.crop(len(PROMPT))
        changed, _ = fwd.step([5, 6], cache, 2, keep=False)
    assert not torch.equal(first, changed)


def test_the_cache_crops_keeps_and_copies_prefixes() -> None:
    fwd = forward_for(tiny_model("llama", dtype=torch.float32))
    cache = fwd.new_cache()
    with torch.inference_mode():
        fwd.step(PROMPT, cache, 0, keep=False)
    copy = cache.prefix(5)
    assert len(copy) == 5 and torch.equal(copy.layers[0].keys, cache.layers[0].keys[:, :5])
    copy.layers[0].keys.zero_()  # its own buffers
    assert cache.layers[0].keys.abs().sum() > 0
    before = cache.layers[1].values.clone()
    with torch.inference_mode():
        cache.keep(4, [1, 3])
    assert len(cache) == 6 and torch.equal(cache.layers[1].values[:, :4], before[:, :4])
    assert torch.equal(cache.layers[1].values[:, 4:6], before[:, [5, 7]])
    for bad in (lambda: cache.crop(7), lambda: cache.prefix(9), lambda: cache.keep(4, [1, 1])):
        with pytest.raises(ValueError):
            bad()


TREE_IDS = [5, 77, 300, 12, 9, 100, 42]  # row 0 the pending token, then a draft tree
TREE = [-1, 0, 1, 0, 3, 2, 1]  # rows 1, 3 children of 0; 2, 6 of 1; 5 of 2; 4 of 3


def path_of(row: int) -> list[int]:
    """Rows from the tree's first row down to ``row``."""
    rows = [row]
    while TREE[rows[0]] >= 0:
        rows.insert(0, TREE[rows[0]])
    return rows


@pytest.mark.parametrize("native", NATIVE)
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_a_tree_row_gets_what_feeding_its_path_gives_and_keep_path_leaves_that_cache(
    tmp_path: Path, kind: str, native: bool
) -> None:
    model = accelerated(tmp_path, kind, native)
    tree = ModelRunner(model)
    assert (tree.model_forward.plan.backend == "native") == native
    tree.keep_hidden(True)
    tree.sync(PROMPT)
    logits = tree.forward_tree(TREE_IDS, TREE)  # [T, V]
    assert logits.shape[0] == len(TREE_IDS) and len(tree) == len(PROMPT) + len(TREE_IDS)
    for row in range(len(TREE)):
        rows = path_of(row)
        plain = ModelRunner(model)
        plain.keep_hidden(True)
        plain.sync(PROMPT)
        expected = plain.forward([TREE_IDS[r] for r in rows], rows=1)[-1]  # [V]
        assert torch.equal(logits[row], expected), f"row {row}"
    tree.keep_path(len(PROMPT), path_of(5))  # rows 0, 1, 2, 5
    assert tree.ids == PROMPT + [TREE_IDS[r] for r in path_of(5)]
    plain = ModelRunner(model)
    plain.keep_hidden(True)
    plain.sync(tree.ids)
    assert plain.hidden is not None and tree.hidden is not None
    assert torch.equal(tree.hidden[: len(plain.ids)], plain.hidden)
    assert torch.equal(tree.forward([8], rows=1), plain.forward([8], rows=1))
    same_caches(tree.cache, plain.cache)


def test_a_bad_tree_is_refused() -> None:
    runner = ModelRunner(tiny_model("llama", dtype=torch.float32))
    runner.sync(PROMPT)
    too_many = [-1, *range(TREE_ROWS)]
    for ids, parents in (([1, 2], [0, 0]), ([1, 2], [-1, 1]), ([1, 2], [-1, -1]),
                         ([1, 2], [-1]), (list(range(TREE_ROWS + 1)), too_many)):
        with pytest.raises(ValueError, match="tree"):
            runner.forward_tree(ids, parents)
    assert runner.ids == PROMPT and len(runner.cache) == len(PROMPT)
    with pytest.raises(ValueError, match="parent"):
        kernels.tree_masks([-1, 2, 0])


def test_models_it_does_not_compute_are_refused_with_the_reason() -> None:
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50))
    with pytest.raises(UnsupportedModelError, match="GPT2LMHeadModel"):
        forward_for(gpt2)
    config = Qwen2Config(vocab_size=50, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         use_sliding_window=True, sliding_window=8, max_window_layers=0)
    with pytest.raises(UnsupportedModelError, match="sliding"):
        forward_for(Qwen2ForCausalLM(config))
    gelu = tiny_model("llama", dtype=torch.float32)
    gelu.config.hidden_act = "gelu"
    with pytest.raises(UnsupportedModelError, match="SiLU"):
        forward_for(gelu)


def test_the_plan_names_the_back_end_formats_and_limits(tmp_path: Path) -> None:
    model = tiny_model("llama", dtype=torch.float32)
    plain = forward_for(model).plan
    assert plain.backend == "reference" and plain.variant is None
    assert plain.formats == {"dense": 2 * 7} and plain.output == "dense"
    assert not plain.row_invariant and "reference because" in plain.summary()
    if kernels.available():
        _, fwd = native_forward(tmp_path, "qwen2")
        plan = fwd.plan
        assert plan.variant == kernels.variant() and plan.rows_per_pass == kernels.max_rows()
        assert sum(plan.formats.values()) == 2 * 7 and plan.row_invariant
        assert set(plan.layers) == {"q", "k", "v", "o", "gate", "up", "down"}
        assert plan.why_reference is None and plan.to_dict()["tree_rows"] == TREE_ROWS
