"""The engine's KV cache grows in place, crops and keeps a tree's path; a prefix cache
follows its ids (entries lagging by 0 or 1); the runner parks the caches of other
conversations and resumes them."""

import pytest
import torch
from transformers import DynamicCache

from engine.cpu import forward as forward_mod
from engine.cpu.forward import MIN_CAPACITY, KVCache, LayerCache
from engine.spec.runner import ModelRunner, PrefixCache
from tests.tiny import tiny_model


def test_writes_and_crops_hold_what_was_written_past_the_first_buffer() -> None:
    torch.manual_seed(0)
    ours, written = KVCache(2), [torch.empty(2, 0, 8), torch.empty(2, 0, 8)]
    steps = [5, 1, 1, -2, 3, MIN_CAPACITY, -7, 1, -300, 4]  # grows past the first buffer
    for step in steps:
        if step < 0:
            length = max(0, len(ours) + step)
            ours.crop(length)
            written = [w[:, :length] for w in written]
        else:
            for i, layer in enumerate(ours.layers):
                k = torch.randn(2, step, 8)
                layer.write(k, -k)
                written[i] = torch.cat([written[i], k], dim=1)
        assert len(ours) == written[0].shape[1]
        for layer, keys in zip(ours.layers, written, strict=True):
            assert torch.equal(layer.keys, keys) and torch.equal(layer.values, -keys)


def test_a_model_decodes_the_same_logits_on_the_runner_as_on_transformers_cache() -> None:
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
        torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
    runner.truncate(6)
    cache.crop(6 - cache.get_seq_length())
    with torch.no_grad():
        want = model(input_ids=torch.tensor([[9]]), cache=cache,
                     use_cache=True).logits[0, -1]
    torch.testing.assert_close(runner.forward([9])[-1], want, rtol=0, atol=1e-4)


def test_keep_moves_the_kept_rows_down_and_refuses_bad_rows() -> None:
    layer = LayerCache()
    keys = torch.arange(2 * 6 * 2, dtype=torch.float32).reshape(2, 6, 2)  # [H, 6, Dh]
    layer.write(keys, -keys)
    layer.keep(2, [0, 2, 3])  # positions 2, 4, 5 follow 0, 1
    assert torch.equal(layer.keys, keys[:, [0, 1, 2, 4, 5]])
    assert torch.equal(layer.values, -keys[:, [0, 1, 2, 4, 5]])
    for rows in ([1, 0], [0, 3], [-1]):
        with pytest.raises(ValueError, match="ascend"):
            layer.keep(2, rows)
    assert layer.keys.shape[1] == 5


def test_the_buffers_grow_by_doubling(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forward_mod, "MIN_CAPACITY", 4)
    layer = LayerCache()
    for _ in range(5):
        layer.write(torch.ones(1, 3, 8), torch.ones(1, 3, 8))
    assert layer.key_buf is not None and layer.key_buf.shape[1] == 16 and layer.length == 15


def counting(runner: ModelRunner) -> list[int]:
    """Record how many ids each forward of ``runner`` feeds."""
    fed: list[int] = []
    forward = runner.forward
    runner.forward = lambda ids, rows=1, head=None: (  # type: ignore[method-assign]
        fed.append(len(ids)) or forward(ids, rows, head))
    return fed


class Entries(list[int]):
    """A stand-in cache: one item an entry."""

    def crop(self, length: int) -> None:
        del self[length:]


@pytest.mark.parametrize("lag", [0, 1])
def test_a_prefix_cache_keeps_the_entries_a_new_sequence_shares(lag: int) -> None:
    ids = [5, 6, 7, 8, 9]
    kept = PrefixCache(Entries(range(len(ids) - lag)), lag)
    kept.ids = list(ids)
    assert len(kept) == len(ids) - lag
    assert kept.reusable([*ids, 10]) == len(ids) - lag  # a continuation keeps them all
    edited = [5, 6, 7, 0, 9]
    assert kept.reusable(edited) == 3 - lag  # an entry needs its ids and `lag` more
    kept.truncate(kept.reusable(edited))
    assert len(kept.cache) == 3 - lag and kept.ids == ids[:3] and len(kept) == 3 - lag
    assert kept.reusable([1, 2]) == 0
    kept.truncate(0)
    assert (kept.ids, list(kept.cache), len(kept)) == ([], [], 0)


def test_resume_swaps_in_the_parked_cache_of_a_conversation_that_comes_back() -> None:
    model = tiny_model("llama", vocab_size=64, seed=1)
    runner, fresh = ModelRunner(model), ModelRunner(model)
    a, b = list(range(3, 43)), [5, 9, 11, *range(20, 50)]  # [40], [33]
    fed = counting(runner)
    for ids in (a, b):
        assert runner.resume(ids) == 0  # b keeps nothing of a: a is parked, not cut down
        runner.sync(ids)
    assert [p.ids for p in runner.parked] == [a]
    follow_up = [*a, 60, 61, 62]
    assert runner.resume(follow_up) == len(a) and runner.ids == a  # swapped back
    assert [p.ids for p in runner.parked] == [b]
    logits = runner.sync(follow_up)
    assert fed == [40, 33, 3]  # a, b, then only a's three new tokens
    assert logits is not None and torch.allclose(logits, fresh.sync(follow_up))
    assert runner.resume(follow_up[:30]) == 30 and runner.parked[0].ids == b  # same chat: cut
    runner.reset()
    assert runner.parked == [] and runner.ids == []


def test_parked_caches_are_bounded_in_number_and_positions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("engine.spec.runner.PARKED", 2)
    monkeypatch.setattr("engine.spec.runner.PARKED_TOKENS", 25)
    runner = ModelRunner(tiny_model("llama", vocab_size=64, seed=1))
    chats = [[start, *range(10, 20)] for start in (3, 4, 5, 6)]  # [11] each
    for ids in chats:
        runner.resume(ids)
        runner.sync(ids)
    assert [p.ids for p in runner.parked] == [chats[2], chats[1]]  # the newest two
    monkeypatch.setattr("engine.spec.runner.PARKED_TOKENS", 15)
    runner.resume(chats[0])
    assert [p.ids for p in runner.parked] == [chats[3]]  # two would hold 22 positions


def test_a_parked_cache_without_features_is_not_resumed_while_features_are_kept() -> None:
    runner = ModelRunner(tiny_model("llama", vocab_size=64, seed=1))
    a, b = [3, *range(10, 20)], [4, *range(10, 20)]
    runner.sync(a)
    runner.keep_hidden(True)  # parks a (no features) and starts over
    assert runner.ids == [] and [p.ids for p in runner.parked] == [a]
    runner.resume(b)
    runner.sync(b)
    assert runner.hidden is not None and runner.parked[0].hidden is None
    assert runner.resume(a) == 0  # a has no features: read again, not swapped in
    runner.sync(a)
    assert runner.parked[0].hidden is not None and len(runner.hidden) == len(a)
    runner.keep_hidden(False)
    assert runner.resume([*b, 30]) == len(b) and runner.hidden is None  # b's features dropped
    runner.keep_hidden(True)  # starts over again: a was parked without features
    assert runner.resume([*a, 31]) == 0 and runner.ids == []


def test_cached_says_what_resume_would_find_with_and_without_features() -> None:
    runner = ModelRunner(tiny_model("llama", vocab_size=64, seed=1))
    a, b = [3, *range(10, 20)], [4, *range(10, 20)]
    runner.sync(a)  # no features
    assert runner.cached([*a, 7], False) == len(a) and runner.cached([*a, 7], True) == 0
    runner.keep_hidden(True)  # parks a
    runner.sync(b)  # with features
    assert runner.cached([*b, 7], True) == runner.cached([*b, 7], False) == len(b)
    assert runner.cached([*a, 7], True) == 0 and runner.cached([*a, 7], False) == len(a)
    assert runner.resume([*a, 7]) == runner.cached([*a, 7], True)


def test_an_edited_earlier_message_continues_from_a_copy_and_keeps_the_old_branch() -> None:
    model = tiny_model("llama", vocab_size=64, seed=1)
    runner, fresh = ModelRunner(model), ModelRunner(model)
    old = list(range(3, 43))  # [40]
    runner.sync(old)
    edited = [*old[:12], 50, 51, 52]  # shares 12 of 40: the old branch is parked whole
    assert runner.resume(edited) == 12 and runner.ids == old[:12]
    assert runner.parked[0].ids == old and runner.parked[0].cache is not runner.cache
    fed = counting(runner)
    logits = runner.sync(edited)
    assert fed == [3] and logits is not None and torch.allclose(logits, fresh.sync(edited))
    assert runner.resume([*old, 60]) == len(old)  # and the old branch comes back intact
    assert torch.allclose(runner.forward([60])[-1], fresh.sync([*old, 60]))


def test_a_prefix_copy_is_a_cache_of_its_own() -> None:
    model = tiny_model("llama", vocab_size=64, seed=1)
    runner = ModelRunner(model)
    runner.sync(list(range(3, 23)))
    copy = runner.cache.prefix(8)
    assert len(copy) == 8
    assert torch.equal(copy.layers[0].keys, runner.cache.layers[0].keys[:, :8])
    copy.layers[0].keys.zero_()  # its own buffers
    assert runner.cache.layers[0].keys.abs().sum() > 0
    with pytest.raises(ValueError, match="no prefix of 30"):
        runner.cache.prefix(30)  # longer than the cache


def test_kept_features_stay_those_of_their_ids_through_growth_crops_trees_and_parking(
) -> None:
    """The runner writes new features into spare room of its buffer; whatever it does next,
    its own and every parked cache's features are still those a fresh read of their ids
    gives (a parked cache's buffer is never written again)."""
    import random

    model = tiny_model("llama", vocab_size=64, seed=1)
    runner = ModelRunner(model)
    runner.keep_hidden(True)
    rng = random.Random(5)

    def features(ids: list[int]) -> torch.Tensor:
        fresh = ModelRunner(model)
        fresh.keep_hidden(True)
        fresh.sync(ids)
        assert fresh.hidden is not None
        return fresh.hidden

    def check() -> None:
        assert runner.hidden is not None and len(runner.hidden) == len(runner.ids)
        if runner.ids:
            assert torch.allclose(runner.hidden, features(runner.ids), atol=1e-10)
        for parked in runner.parked:
            assert parked.hidden is not None
            assert torch.allclose(parked.hidden, features(parked.ids), atol=1e-10)

    chats = [[3, 4], [5, 6, 7]]
    for _ in range(60):
        op = rng.choice(["grow", "grow", "grow", "crop", "tree", "switch", "restart"])
        if op == "grow":
            runner.forward([rng.randrange(3, 64) for _ in range(rng.randint(1, 40))])
        elif op == "crop" and runner.ids:
            runner.truncate(rng.randrange(len(runner.ids)))
        elif op == "tree" and runner.ids:
            start = len(runner.ids)
            runner.forward_tree([rng.randrange(3, 64) for _ in range(4)], [-1, 0, 0, 1])
            runner.keep_path(start, [0, 2])  # the root and its second child
        elif op == "switch":
            chats.append(list(runner.ids))
            other = rng.choice(chats)
            runner.resume(other)
            runner.sync(other)
        elif op == "restart":
            runner.start_over(0)  # parks the cache, features and all
        check()
