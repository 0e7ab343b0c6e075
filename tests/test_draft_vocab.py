"""The short output layer of drafters: the kept ids' logits unchanged, the rest ``-inf``."""

import pytest
import torch
from torch import nn

from engine.cpu import kernels
from engine.cpu.layers import Q4Linear, Q8Linear
from engine.drafters.vocab import ShortHead, as_int4, short_head

VOCAB, HIDDEN, SIZE = 96, 64, 40


def check(layer: nn.Module, exact: bool) -> None:
    torch.manual_seed(0)
    x = torch.randn(3, HIDDEN)
    short = short_head(layer, extra_ids=[90, 3, 95], size=SIZE)
    assert isinstance(short, ShortHead)
    full, out = layer(x), short(x)  # [3, V]
    kept = torch.tensor([*range(SIZE), 90, 95])
    same = torch.equal if exact else torch.allclose
    assert same(out[:, kept], full[:, kept])
    dropped = torch.ones(VOCAB, dtype=torch.bool)
    dropped[kept] = False
    assert torch.isinf(out[:, dropped]).all() and (out[:, dropped] < 0).all()


def test_a_dense_head_keeps_the_frequent_and_named_ids() -> None:
    torch.manual_seed(1)
    check(nn.Linear(HIDDEN, VOCAB, bias=True), exact=False)


@pytest.mark.skipif(not kernels.available(), reason="needs the native kernels (AVX2)")
@pytest.mark.parametrize("kind", ["q4", "q8"])
def test_quantized_heads_give_the_same_rows_bit_for_bit(kind: str) -> None:
    torch.manual_seed(2)
    weight, bias = torch.randn(VOCAB, HIDDEN), torch.randn(VOCAB)
    layer = Q4Linear.from_dense(weight, bias) if kind == "q4" else Q8Linear.from_weight(weight)
    check(layer, exact=True)


def test_a_small_vocabulary_or_an_unknown_layer_is_left_alone() -> None:
    small = nn.Linear(HIDDEN, SIZE)
    assert short_head(small, [], size=SIZE) is small

    class Odd(nn.Module):
        out_features = VOCAB

    odd = Odd()
    assert short_head(odd, [], size=SIZE) is odd


@pytest.mark.skipif(not kernels.available(), reason="needs the native kernels (AVX2)")
def test_an_int4_short_head_rounds_only_the_kept_rows() -> None:
    torch.manual_seed(3)
    layer = nn.Linear(HIDDEN, VOCAB, bias=True)
    short = short_head(layer, extra_ids=[90, 95], size=SIZE, int4=True)
    assert isinstance(short, ShortHead) and isinstance(short.frequent, Q4Linear)
    x = torch.randn(3, HIDDEN)
    full, out = layer(x), short(x)  # [3, V]
    assert torch.allclose(out[:, [90, 95]], full[:, [90, 95]])  # the named rows stay exact
    rounded = (out[:, :SIZE] - full[:, :SIZE]).abs().max() / full[:, :SIZE].abs().max()
    assert 0 < rounded < 0.1  # 4 bits per 32 inputs: close, not equal
    assert torch.isinf(out[:, SIZE:90]).all()
    assert isinstance(as_int4(nn.Linear(HIDDEN, SIZE)), Q4Linear)


def test_int4_leaves_layers_it_cannot_read_or_run_alone() -> None:
    odd = nn.Linear(HIDDEN + 1, VOCAB)  # not a multiple of 32 inputs
    assert as_int4(odd) is odd
    q8 = Q8Linear.from_weight(torch.randn(VOCAB, HIDDEN)) if kernels.available() else odd
    assert as_int4(q8) is q8
