"""The growing KV cache holds what transformers' DynamicCache holds, step for step."""

import pytest
import torch
from transformers import DynamicCache

from engine.kvcache import MIN_CAPACITY, GrowingLayer, growing_cache
from engine.runner import ModelRunner
from tests.tiny import tiny_model


def test_updates_and_crops_match_dynamic_cache() -> None:
    torch.manual_seed(0)
    model = tiny_model("llama", dtype=torch.float32)
    ours, theirs = growing_cache(model.config), DynamicCache(config=model.config)
    assert all(isinstance(layer, GrowingLayer) for layer in ours.layers)
    steps = [5, 1, 1, -2, 3, MIN_CAPACITY, -7, 1, -300, 4]  # grows past the first buffer
    for step in steps:
        if step < 0:
            ours.crop(step)
            theirs.crop(max(step, -theirs.get_seq_length()))
        else:
            for i in range(len(ours.layers)):
                k, v = torch.randn(1, 2, step, 8), torch.randn(1, 2, step, 8)
                got, want = ours.update(k, v, i), theirs.update(k, v, i)
                assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        assert ours.get_seq_length() == theirs.get_seq_length()
        for a, b in zip(ours.layers, theirs.layers, strict=True):
            assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def test_a_model_decodes_the_same_logits_on_either_cache() -> None:
    model = tiny_model("qwen2", dtype=torch.float32)
    ids = [3, 17, 42, 99, 7, 250, 11, 60, 5, 77]
    runner = ModelRunner(model)
    runner.sync(ids[:4])
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=torch.tensor([ids[:4]]), cache=cache, use_cache=True)
    for t in ids[4:]:
        got = runner.forward([t])[-1]
        with torch.no_grad():
            want = model(input_ids=torch.tensor([[t]]), cache=cache,
                         use_cache=True).logits[0, -1]
        assert torch.equal(got, want)
    runner.truncate(6)
    cache.crop(6 - cache.get_seq_length())
    with torch.no_grad():
        want = model(input_ids=torch.tensor([[9]]), cache=cache,
                     use_cache=True).logits[0, -1]
    assert torch.equal(runner.forward([9])[-1], want)


def test_keep_moves_the_kept_rows_down_and_refuses_bad_rows() -> None:
    layer = GrowingLayer()
    keys = torch.arange(2 * 6 * 2, dtype=torch.float32).reshape(1, 2, 6, 2)  # [B, H, 6, Dh]
    layer.update(keys, -keys)
    layer.keep(2, [0, 2, 3])  # positions 2, 4, 5 follow 0, 1
    assert torch.equal(layer.keys, keys[:, :, [0, 1, 2, 4, 5]])
    assert torch.equal(layer.values, -keys[:, :, [0, 1, 2, 4, 5]])
    for rows in ([1, 0], [0, 3], [-1]):
        with pytest.raises(ValueError, match="ascend"):
            layer.keep(2, rows)
    assert layer.keys.shape[-2] == 5
