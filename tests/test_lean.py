"""The lean decoding step computes what the model's own forward computes: exactly in
Python, within float32 rounding as one native call; either way a k-row step gives each
row exactly what a one-row step gives."""

from pathlib import Path

import pytest
import torch

from engine.cpu import kernels, kvcache
from engine.cpu.kvcache import growing_cache
from engine.cpu.lean import LeanStep, lean_step
from engine.cpu.quantize import accelerate
from engine.runner import ModelRunner
from tests.test_fastlinear import NATIVE, accelerated, gguf_model
from tests.tiny import tiny_model


@pytest.mark.parametrize("native", NATIVE)
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_lean_step_is_bit_identical_to_the_forward(tmp_path: Path, kind: str, native: bool
                                                   ) -> None:
    model, path = gguf_model(tmp_path, kind)
    accelerate(model, path, "int4+int8", native=native)
    step = lean_step(model)
    assert step is not None and (step.native is not None) == native
    step.native = None  # the Python route; the native one is tested below
    ours, theirs = growing_cache(model.config), growing_cache(model.config)
    prompt = torch.tensor([[3, 17, 42, 99, 7, 250, 11, 60]])
    with torch.inference_mode():
        model(input_ids=prompt, cache=ours)
        model(input_ids=prompt, cache=theirs)
        for new in ([5], [77, 300, 12], [9, 100, 42, 8, 1], [4]):
            rows = len(new)
            logits, hidden = step.step(new, ours, rows, keep=True)
            out = model(input_ids=torch.tensor([new]), cache=theirs, logits_to_keep=rows,
                        output_hidden_states=True)
            assert torch.equal(logits, out.logits)
            assert hidden is not None and torch.equal(hidden, out.hidden_states[-1])
        ours.crop(-3)
        theirs.crop(-3)
        logits, hidden = step.step([6, 7], ours, 1, keep=False)
        out = model(input_ids=torch.tensor([[6, 7]]), cache=theirs, logits_to_keep=1)
        assert torch.equal(logits, out.logits) and hidden is None


def test_models_off_row_attention_keep_their_own_forward() -> None:
    model = tiny_model("llama", dtype=torch.float32)
    assert lean_step(model) is None
    assert ModelRunner(model).lean is None
    accelerate(model, None, "fp32", row_attention=True)
    step = lean_step(model)
    assert step is not None
    with pytest.raises(ValueError, match="lean step"):
        step.step(list(range(17)), growing_cache(model.config), 1, keep=False)


def native_step(tmp_path: Path, kind: str) -> tuple[torch.nn.Module, LeanStep]:
    if not kernels.available():
        pytest.skip("native kernels need AVX2, FMA, F16C and a C++ compiler")
    model, path = gguf_model(tmp_path, kind)
    accelerate(model, path, "int4+int8", native=True)
    step = lean_step(model)
    assert step is not None and step.native is not None
    return model, step


PROMPT = [3, 17, 42, 99, 7, 250, 11, 60]


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_the_native_step_matches_the_forward_within_rounding(tmp_path: Path, kind: str) -> None:
    model, step = native_step(tmp_path, kind)
    ours, theirs = growing_cache(model.config), growing_cache(model.config)
    with torch.inference_mode():
        model(input_ids=torch.tensor([PROMPT]), cache=ours)
        model(input_ids=torch.tensor([PROMPT]), cache=theirs)
        for new in ([5], [77, 300, 12], [9, 100, 42, 8, 1], [4]):
            logits, hidden = step.step(new, ours, len(new), keep=True)
            out = model(input_ids=torch.tensor([new]), cache=theirs, logits_to_keep=len(new),
                        output_hidden_states=True)
            torch.testing.assert_close(logits, out.logits, rtol=0, atol=2e-2)
            assert hidden is not None
            torch.testing.assert_close(hidden, out.hidden_states[-1], rtol=0, atol=2e-2)
        for layer_ours, layer_theirs in zip(ours.layers, theirs.layers, strict=True):
            torch.testing.assert_close(layer_ours.keys, layer_theirs.keys, rtol=0, atol=2e-2)
            torch.testing.assert_close(layer_ours.values, layer_theirs.values, rtol=0, atol=2e-2)


@pytest.mark.parametrize(("kind", "count"), [("llama", 6), ("qwen2", 6), ("llama", 16)])
def test_a_native_k_row_step_gives_each_row_what_one_row_steps_give(
    tmp_path: Path, kind: str, count: int, variant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under every kernel variant; 16 rows: one pass over the weights in AVX-512's."""
    monkeypatch.setattr(kvcache, "MIN_CAPACITY", 10)  # the buffers grow during the test
    model, step = native_step(tmp_path, kind)
    rows, single = growing_cache(model.config), growing_cache(model.config)
    new = [9, 100, 42, 8, 1, 77, 5, 64, 3, 31, 12, 90, 2, 55, 18, 70][:count]
    with torch.inference_mode():
        for cache in (rows, single):
            model(input_ids=torch.tensor([PROMPT]), cache=cache)
        together, _ = step.step(new, rows, len(new), keep=False)  # [1, count, V]
        apart = torch.cat([step.step([t], single, 1, keep=False)[0] for t in new], dim=1)
    assert torch.equal(together, apart)
    assert rows.get_seq_length() == single.get_seq_length() == len(PROMPT) + len(new)
    for a, b in zip(rows.layers, single.layers, strict=True):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def test_the_native_step_follows_replaced_weights_and_cropped_caches(tmp_path: Path) -> None:
    model, step = native_step(tmp_path, "qwen2")
    cache = growing_cache(model.config)
    with torch.inference_mode():
        model(input_ids=torch.tensor([PROMPT]), cache=cache)
        first, _ = step.step([5, 6], cache, 2, keep=False)
        cache.crop(-2)
        again, _ = step.step([5, 6], cache, 2, keep=False)
        assert torch.equal(first, again) and cache.get_seq_length() == len(PROMPT) + 2
        down = model.model.layers[0].mlp.down_proj
        name = down.BUFFERS[0]
        down._buffers[name] = torch.zeros_like(down._buffers[name])  # a new array
        cache.crop(-2)
        changed, _ = step.step([5, 6], cache, 2, keep=False)
    assert not torch.equal(first, changed)


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
    assert tree.verifies_trees and tree.lean is not None
    assert (tree.lean.native is not None) == native
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
    for a, b in zip(tree.cache.layers, plain.cache.layers, strict=True):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def test_a_bad_tree_is_refused(tmp_path: Path) -> None:
    model = tiny_model("llama", dtype=torch.float32)
    accelerate(model, None, "fp32", row_attention=True)
    runner = ModelRunner(model)
    runner.sync(PROMPT)
    for parents in ([0, 0], [-1, 1], [-1, -1], [-1]):
        with pytest.raises(ValueError, match="tree"):
            runner.forward_tree([1, 2], parents)
    assert runner.ids == PROMPT
    with pytest.raises(ValueError, match="parent"):
        kernels.tree_masks([-1, 2, 0])
