"""Our native kernels against a pure torch reference of the same arithmetic, under every
kernel variant this CPU runs (the ``variant`` fixture forces each in turn)."""

import logging
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType as QuantType
from gguf import quants

from engine.cpu import kernels, pages
from engine.cpu.gguf import GroupQuant, Q6Blocks, decode_int4, decode_q6_k
from engine.cpu.layers import (
    Q6P_ORDER,
    Int8Linear,
    NativeCall,
    Q4KLinear,
    Q4Linear,
    Q6KLinear,
    Q6KPLinear,
    Q8Linear,
    kernel_order,
    pack_factors,
    pack_pairs,
    pack_q6,
    unpack_factors,
    unpack_pairs,
    unpack_q6,
)
from engine.cpu.quantize import accelerate, cache_path
from tests.test_quant import q4_k_blocks, q6_k_blocks

pytestmark = pytest.mark.skipif(
    not kernels.available(), reason="native kernels need AVX2, FMA, F16C and a C++ compiler"
)
GROUP = kernels.GROUP



def quantize_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Activations ``[M, K]`` -> int8 codes ``[M, G, 32]`` and scale ``[M, G]`` (dx)."""
    g = x.float().unflatten(-1, (-1, GROUP))  # [M, G, 32]
    dx = g.abs().amax(-1) / 127.0  # [M, G]
    inv = torch.where(dx > 0, 1.0 / dx, torch.zeros_like(dx))
    return torch.round(g * inv.unsqueeze(-1)), dx


def q4_reference(x: torch.Tensor, layer: Q4Linear) -> torch.Tensor:
    """What the q4 kernel computes, in float64 from the same integer products."""
    codes, dx = quantize_reference(x)  # [M, G, 32], [M, G]
    q = layer.unpacked().double()  # [N, G, 32]
    dots = torch.einsum("mgk,ngk->mng", codes.double(), q)  # [M, N, G] exact
    y = (dots * dx.double()[:, None] * layer.scale.double()).sum(-1)
    y += (layer.offset.double() * (dx.double() * codes.double().sum(-1))[:, None]).sum(-1)
    return y if layer.bias is None else y + layer.bias.double()


def q8_reference(x: torch.Tensor, layer: Q8Linear) -> torch.Tensor:
    codes, dx = quantize_reference(x)
    w = layer.q.double().unflatten(-1, (-1, GROUP))  # [N, G, 32]
    dots = torch.einsum("mgk,ngk->mng", codes.double(), w)  # [M, N, G]
    y = (dots * dx.double()[:, None]).sum(-1) * layer.scale.double()
    return y if layer.bias is None else y + layer.bias.double()


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal up to float32 rounding of the sums (a few ulps of the largest output)."""
    return bool((a.double() - b).abs().max() <= 1e-5 * b.abs().max())


def q4_layer(n: int, k: int, bias: bool) -> tuple[Q4Linear, torch.Tensor]:
    data = q4_k_blocks(n, k)
    g = decode_int4(data, QuantType.Q4_K, n, k)
    b = torch.randn(n) if bias else None
    return Q4Linear.from_groups(g, b), torch.from_numpy(quants.dequantize(data, QuantType.Q4_K))


@pytest.mark.parametrize(("n", "k", "bias"), [(64, 256, False), (37, 512, True), (200, 768, True),
                                             (24, 96, False), (19, 352, True)])
def test_q4_kernel_matches_the_reference(n: int, k: int, bias: bool, variant: str) -> None:
    """Also with groups left over after blocks of 8: pairs, and a last unpaired group."""
    torch.manual_seed(0)
    if k % 256 == 0:
        layer, _ = q4_layer(n, k, bias)
    else:
        layer = Q4Linear.from_dense(torch.randn(n, k) * 0.05, torch.randn(n) if bias else None)
    x = torch.randn(11, k) * 3  # more rows than one pass (8) holds
    assert close(layer(x), q4_reference(x, layer))


def test_q4_layer_holds_the_gguf_weight_up_to_float16_scales() -> None:
    layer, dense = q4_layer(48, 512, False)  # Q4_K: d * sc rounded to float16
    assert float((layer.dequantized() - dense).abs().max() / dense.abs().max()) < 2**-10
    w = torch.randn(16, 256).numpy() * 0.05
    data = quants.quantize(w, QuantType.Q4_1)  # float16 d and m: held exactly
    exact = Q4Linear.from_groups(decode_int4(data, QuantType.Q4_1, 16, 256)).dequantized()
    assert torch.equal(exact, torch.from_numpy(quants.dequantize(data, QuantType.Q4_1)))


@pytest.mark.parametrize(("n", "k", "bias"), [(40, 96, False), (129, 576, True)])
def test_q8_kernel_matches_the_reference(n: int, k: int, bias: bool, variant: str) -> None:
    torch.manual_seed(1)
    linear = torch.nn.Linear(k, n, bias=bias)
    layer = Q8Linear.from_weight(linear.weight, linear.bias)
    x = torch.randn(9, k)
    assert close(layer(x), q8_reference(x, layer))
    assert torch.equal(layer.q, Int8Linear.from_weight(linear.weight).q)


def test_every_row_is_the_same_whatever_the_number_of_rows(variant: str) -> None:
    torch.manual_seed(2)
    layer, _ = q4_layer(48, 512, True)
    q8 = Q8Linear.from_weight(torch.randn(48, 512))
    x = torch.randn(17, 512)
    for lay in (layer, q8):
        full = lay(x)  # [17, N]: passes of 8 + 8 + 1 rows
        for m in range(1, 17):
            assert torch.equal(lay(x[:m]), full[:m])
        assert torch.equal(lay(x[5:6]), full[5:6])


def test_zero_and_bfloat16_inputs(variant: str) -> None:
    layer, _ = q4_layer(32, 256, True)
    x = torch.zeros(2, 256)
    assert torch.equal(layer(x), layer.bias.expand(2, -1))
    xb = torch.randn(3, 256, dtype=torch.bfloat16)
    y = layer(xb)  # computed in float32, returned in the input's dtype
    expected = q4_reference(xb.float(), layer)
    assert y.dtype == torch.bfloat16
    assert ((y.double() - expected).abs() <= expected.abs() * 2**-8 + 1e-6).all()


def test_q4_linear_from_groups_packs_nibbles_in_group_halves() -> None:
    q = torch.arange(64, dtype=torch.uint8).remainder(16).reshape(1, 64).repeat(2, 1)
    g = GroupQuant(q, torch.ones(2, 2), torch.zeros(2, 2))
    layer = Q4Linear.from_groups(g)
    assert layer.codes[0, 0] == 0 | (0 << 4) and layer.codes[0, 1] == 1 | (1 << 4)
    assert torch.equal(layer.dequantized(), q.float())


def test_q4k_codes_pack_super_blocks_in_the_kernel_order() -> None:
    torch.manual_seed(5)
    q = torch.randint(0, 16, (3, 512), dtype=torch.uint8)
    codes = pack_pairs(q)  # [3, 256]
    assert codes.shape == (3, 256)
    # super-block 1, chunk c, byte 4g + r: inputs 32g + 8c + r (low) and 32g + 8c + 4 + r
    assert all(int(codes[2, 128 + 32 * c + 4 * g + r])
               == int(q[2, 256 + 32 * g + 8 * c + r]) | int(q[2, 256 + 32 * g + 8 * c + 4 + r]) << 4
               for c in range(4) for g in range(8) for r in range(4))
    assert torch.equal(unpack_pairs(codes).flatten(1), q)


def test_the_kernel_order_is_a_permutation_and_its_own_inverse() -> None:
    i = torch.arange(512)
    order = kernel_order(i)
    assert sorted(order.tolist()) == i.tolist() and torch.equal(kernel_order(order), i)
    assert order[32 * 3 + 4 * 5 + 2] == 32 * 5 + 4 * 3 + 2  # vector 3, group 5, byte 2


def test_a_failed_build_falls_back_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("ANVE_KERNEL_DIR", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))  # no compiler on the path
    kernels.reset()
    try:
        with caplog.at_level(logging.WARNING):
            assert kernels.library() is None and kernels.variant() is None
        assert "no C++ compiler" in caplog.text
        with pytest.raises(RuntimeError, match="not available"):
            Q8Linear.from_weight(torch.ones(1, 32))(torch.ones(1, 32))
    finally:
        kernels.reset()
    monkeypatch.undo()
    assert kernels.available()


def test_the_library_is_built_once_per_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                              ) -> None:
    monkeypatch.setenv("ANVE_KERNEL_DIR", str(tmp_path))
    kernels.reset()
    try:
        best = kernels.buildable()[-1]  # only the variant that runs is built
        path = kernels.library_path(best)
        assert path.parent == tmp_path and not path.exists()
        assert kernels.library() is not None and path.is_file()
        assert kernels.variant() == best
        assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary left
        assert len({kernels.library_path(name) for name in kernels.BY_NAME}) == len(
            kernels.BY_NAME)  # one file per variant
    finally:
        kernels.reset()


def test_from_dense_rounds_each_group_to_4_bits() -> None:
    torch.manual_seed(3)
    w = torch.randn(24, 128)
    w[0, :32] = 0.5  # a constant group: zero step, held exactly
    layer = Q4Linear.from_dense(w)
    step = layer.scale.float().repeat_interleave(GROUP, dim=1)  # [N, K]
    assert ((layer.dequantized() - w).abs() <= step / 2 + 2e-3 * w.abs().amax()).all()
    assert torch.equal(layer.dequantized()[0, :32], w[0, :32])


def test_a_requantized_draft_runs_every_layer_in_4_bits(tmp_path: Path) -> None:
    from tests.test_fastlinear import gguf_model

    model, path = gguf_model(tmp_path)
    report = accelerate(model, path, "int4+int8", native=True, requantize=True,
                        cache_dir=tmp_path / "cache")
    assert set(report.layers) == {"q4", "q4k"} and report.row_invariant
    assert cache_path(tmp_path / "cache", "int4+int8", torch.float32, True, True).is_file()


def q4k_reference(x: torch.Tensor, layer: Q4KLinear) -> torch.Tensor:
    """What the q4k kernel computes: activations rounded per 256, exact group products."""
    g = x.float().unflatten(-1, (-1, 256))  # [M, S, 256]
    dx = g.abs().amax(-1) / 127.0  # [M, S]
    inv = torch.where(dx > 0, 1.0 / dx, torch.zeros_like(dx))
    codes = torch.round(g * inv.unsqueeze(-1)).double().unflatten(-1, (8, GROUP))  # [M,S,8,32]
    q = layer.unpacked().double().unflatten(1, (-1, 8))  # [N, S, 8, 32]
    sc, mn, d, dmin = layer.factors()
    sc = sc.double().unflatten(1, (-1, 8))  # [N, S, 8]
    mn = mn.double().unflatten(1, (-1, 8))
    dots = torch.einsum("msjk,nsjk->mnsj", codes, q)  # [M, N, S, 8] exact
    scaled = (dots * sc).sum(-1) * d.double() * dx.double()[:, None]  # [M, N, S]
    mins = (codes.sum(-1)[:, None] * mn).sum(-1) * dmin.double() * dx.double()[:, None]
    y = (scaled - mins).sum(-1)
    return y if layer.bias is None else y + layer.bias.double()


# 256: one super-block, unpaired; 1536: three pairs (AVX-512 sums a pair in one vector);
# 1280: two pairs and a last one alone; 4352: from 8 rows on more activations than L1
# holds, so AVX-512 takes two output features at once (37 of them: one left alone a tile)
@pytest.mark.parametrize(("n", "k", "bias"), [(64, 256, False), (37, 1536, True),
                                              (50, 1280, False), (37, 4352, True)])
def test_q4k_kernel_matches_the_reference_and_holds_the_gguf_weight(
    n: int, k: int, bias: bool, variant: str
) -> None:
    torch.manual_seed(4)
    data = q4_k_blocks(n, k)
    g = decode_int4(data, QuantType.Q4_K, n, k)
    layer = Q4KLinear.from_groups(g, torch.randn(n) if bias else None)
    exact = torch.from_numpy(quants.dequantize(data, QuantType.Q4_K))
    assert torch.equal(layer.dequantized(), exact)
    x = torch.randn(40, k) * 3  # 32 rows on up: q4k's tiles in the amx variant
    y = layer(x)
    assert close(y, q4k_reference(x, layer))
    for m in (*range(1, 12), 16, 17, 33):  # passes of 8 or 16 rows, tiles: the same rows
        assert torch.equal(layer(x[:m]), y[:m])


def test_q4k_factors_sit_in_one_record_per_pair_of_super_blocks() -> None:
    """``pack_factors``' bytes where its docstring puts them, a lone last super-block's
    partner zero, and d or dmin that float16 cannot hold refused."""
    torch.manual_seed(15)
    n, s = 3, 5  # two pairs and a lone super-block
    sc = torch.randint(0, 64, (n, s * 8), dtype=torch.uint8)
    mn = torch.randint(0, 64, (n, s * 8), dtype=torch.uint8)
    d, dmin = torch.rand(n, s).half().float(), torch.rand(n, s).half().float()
    meta = pack_factors(sc, mn, d, dmin)
    assert meta.shape == (n, 3 * 40) and meta.dtype == torch.uint8
    for row in range(n):
        for sb in range(s):
            record = meta[row, 40 * (sb // 2) : 40 * (sb // 2 + 1)]
            half = sb % 2
            assert torch.equal(record[8 * half : 8 * half + 8], sc[row, 8 * sb : 8 * sb + 8])
            assert torch.equal(record[16 + 8 * half : 24 + 8 * half], mn[row, 8 * sb : 8 * sb + 8])
            for at, value in ((32, d), (36, dmin)):
                held = record[at + 2 * half : at + 2 * half + 2].clone().view(torch.float16)
                assert float(held) == float(value[row, sb])
        assert not meta[row, 80 + 8 : 80 + 16].any() and not meta[row, 80 + 24 : 80 + 32].any()
        assert not meta[row, 80 + 34 : 80 + 36].any() and not meta[row, 80 + 38 :].any()
    unpacked = unpack_factors(meta, s)
    for got, expected in zip(unpacked, (sc, mn, d, dmin), strict=True):
        assert torch.equal(got, expected)
    with pytest.raises(ValueError, match="float16"):
        pack_factors(sc, mn, d + 1e-6, dmin)


def test_q4k_needs_super_blocks() -> None:
    w = torch.randn(16, 256).numpy() * 0.05
    data = quants.quantize(w, QuantType.Q4_1)
    with pytest.raises(ValueError, match="super-block"):
        Q4KLinear.from_groups(decode_int4(data, QuantType.Q4_1, 16, 256))


def q6k_reference(x: torch.Tensor, b: Q6Blocks, bias: torch.Tensor | None) -> torch.Tensor:
    g = x.float().unflatten(-1, (-1, 256))  # [M, S, 256]
    dx = g.abs().amax(-1) / 127.0  # [M, S]
    inv = torch.where(dx > 0, 1.0 / dx, torch.zeros_like(dx))
    codes = torch.round(g * inv.unsqueeze(-1)).double().unflatten(-1, (16, 16))  # [M,S,16,16]
    q = b.q.double().unflatten(-1, (-1, 16, 16))  # [N, S, 16, 16]
    dots = torch.einsum("msjk,nsjk->mnsj", codes, q)  # [M, N, S, 16] exact
    scaled = (dots * b.sc.double().unflatten(-1, (-1, 16))).sum(-1)  # [M, N, S]
    y = (scaled * b.d.double() * dx.double()[:, None]).sum(-1)
    return y if bias is None else y + bias.double()


@pytest.mark.parametrize("form", [Q6KLinear, Q6KPLinear])
@pytest.mark.parametrize(("n", "k", "bias"), [(40, 256, False), (19, 1536, True)])
def test_q6k_kernel_holds_the_gguf_weight_and_matches_the_reference(
    n: int, k: int, bias: bool, form: type[Q6KLinear | Q6KPLinear], variant: str
) -> None:
    torch.manual_seed(6)
    data = q6_k_blocks(n, k)
    blocks = decode_q6_k(data, n, k)
    exact = torch.from_numpy(quants.dequantize(data, QuantType.Q6_K))
    assert torch.equal(blocks.dequantize(), exact)
    layer = form.from_blocks(blocks, torch.randn(n) if bias else None)
    assert torch.equal(layer.dequantized(), exact)
    x = torch.randn(9, k) * 2
    y = layer(x)
    assert close(y, q6k_reference(x, blocks, layer.bias))
    for m in range(1, 9):
        assert torch.equal(layer(x[:m]), y[:m])


def test_q6_codes_pack_into_six_bits_where_the_layout_says() -> None:
    """``pack_q6``'s bytes, read back one code at a time as its docstring places them."""
    torch.manual_seed(13)
    q = torch.randint(-32, 32, (3, 512), dtype=torch.int8)  # kernel order
    packed = pack_q6(q)
    assert packed.shape == (3, 384) and packed.dtype == torch.uint8
    assert torch.equal(unpack_q6(packed), q)
    for row in range(3):
        for sb in range(2):
            block = packed[row, 192 * sb : 192 * (sb + 1)].tolist()
            for i in range(256):  # u[i] belongs to kernel vector Q6P_ORDER[i // 32]
                low = block[i % 128] >> (4 * (i // 128)) & 0x0F
                top = block[128 + i % 64] >> (2 * (i // 64)) & 0x03
                at = 256 * sb + Q6P_ORDER[i // 32] * 32 + i % 32
                assert (low | top << 4) - 32 == int(q[row, at]), (row, sb, i)


def test_q6kp_blocks_hold_codes_scales_and_d_where_the_layout_says() -> None:
    torch.manual_seed(16)
    n, k = 5, 768
    b = decode_q6_k(q6_k_blocks(n, k), n, k)
    layer = Q6KPLinear.from_blocks(b)
    assert layer.blocks.shape == (n, 3 * 210) and (layer.out_features, layer.in_features) == (n, k)
    blocks = layer.blocks.reshape(n, 3, 210)
    assert torch.equal(blocks[..., :192].reshape(n, -1), pack_q6(kernel_order(b.q)))
    assert torch.equal(blocks[..., 192:208].reshape(n, -1).view(torch.int8), b.sc)
    assert torch.equal(blocks[..., 208:].contiguous().view(torch.float16).reshape(n, 3).float(),
                       b.d)
    parts = layer.parts()
    assert torch.equal(parts.q, b.q) and torch.equal(parts.sc, b.sc) and torch.equal(parts.d, b.d)
    with pytest.raises(ValueError, match="float16"):
        Q6KPLinear.from_blocks(Q6Blocks(b.q, b.sc, b.d + 1e-6))


@pytest.mark.parametrize(("n", "k"), [(37, 1536), (24, 4352)])
def test_q6_codes_in_six_bits_give_the_bits_of_a_byte_each(n: int, k: int, variant: str
                                                          ) -> None:
    """q6kp is q6k's weights from fewer bytes: the same integers and float steps in every
    variant, so the same outputs at every row count (the AVX-512 loop takes one way up
    to 4 rows and another above), with and without a bias."""
    torch.manual_seed(14)
    blocks = decode_q6_k(q6_k_blocks(n, k), n, k)
    bias = torch.randn(n)
    for with_bias in (None, bias):
        plain = Q6KLinear.from_blocks(blocks, with_bias)
        packed = Q6KPLinear.from_blocks(blocks, with_bias)
        for rows in (1, 2, 4, 5, 8, 16, 17, 40):
            x = torch.randn(rows, k) * 2
            assert torch.equal(packed(x), plain(x)), (rows, with_bias is None)


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Row ``t`` of ``q [1, H, T, Dh]`` over its causal prefix of ``k``, ``v``, in float64."""
    _, h, t, dh = q.shape
    group, length = h // k.shape[1], k.shape[2]
    out = torch.empty(1, t, h, dh, dtype=torch.float64)
    for row in range(t):
        end = length - t + row + 1
        for head in range(h):
            keys = k[0, head // group, :end].double()  # [end, Dh]
            weights = (keys @ q[0, head, row].double() * dh**-0.5).softmax(-1)  # [end]
            out[0, row, head] = weights @ v[0, head // group, :end].double()
    return out


def test_row_attention_matches_the_reference_and_each_row_stands_alone(variant: str) -> None:
    torch.manual_seed(0)
    capacity, length, rows = 80, 57, 5
    buffer = torch.randn(2, 1, 2, capacity, 16)  # keys, values with room to grow
    k, v = buffer[0, :, :, :length], buffer[1, :, :, :length]  # [1, Hkv, L, Dh] views
    q = torch.randn(1, 6, rows, 16)
    out = kernels.row_attention(q, k, v, 16**-0.5)
    assert torch.allclose(out.double(), reference_attention(q, k, v), atol=1e-5)
    for t in range(rows):  # the same row computed alone, with the cache cut at its end
        end = length - rows + t + 1
        alone = kernels.row_attention(q[:, :, t : t + 1], k[:, :, :end], v[:, :, :end],
                                      16**-0.5)
        assert torch.equal(alone[:, 0], out[:, t])


@pytest.mark.parametrize(("heads", "kv_heads", "dh", "length", "rows"), [
    (12, 2, 128, 150, 1),  # the appliance's grouping, past two spans of 64 positions
    (6, 2, 80, 70, 3),  # an output block of 64 values and two of 8
    (40, 1, 24, 65, 1),  # one key/value head for 40: split into parts of at most 32
    (12, 2, 64, 90, 20),  # rows in tasks of 16, then 4
])
def test_grouped_heads_get_the_bits_of_each_head_alone(
    heads: int, kv_heads: int, dh: int, length: int, rows: int, variant: str
) -> None:
    """The query heads of a key/value head, and the rows of a step, run as one task over
    spans of the cache: each row and head gets what it gets alone, which is what the same
    attention gives with the key/value head repeated for each query head (one head a
    task) and what the row gets computed alone, causal or with a draft tree."""
    torch.manual_seed(13)
    q = torch.randn(1, heads, rows, dh)
    k, v = torch.randn(1, kv_heads, length, dh), torch.randn(1, kv_heads, length, dh)
    alone_k = k.repeat_interleave(heads // kv_heads, dim=1)
    alone_v = v.repeat_interleave(heads // kv_heads, dim=1)
    parents = [-1] + [(i - 1) // 2 for i in range(1, rows)]  # a binary draft tree
    trees = [None] + ([kernels.tree_masks(parents)] if rows > 1 else [])
    for tree in trees:
        grouped = kernels.row_attention(q, k, v, dh**-0.5, tree)
        assert torch.equal(grouped, kernels.row_attention(q, alone_k, alone_v, dh**-0.5, tree))
    causal = kernels.row_attention(q, k, v, dh**-0.5)
    for t in range(rows):  # each row alone, the cache cut at its end
        end = length - rows + t + 1
        alone = kernels.row_attention(q[:, :, t : t + 1], k[:, :, :end], v[:, :, :end],
                                      dh**-0.5)
        assert torch.equal(alone[:, 0], causal[:, t])
    assert torch.allclose(kernels.row_attention(q, k, v, dh**-0.5).double(),
                          reference_attention(q, k, v), atol=1e-5)


def test_layers_sharing_an_input_in_one_call_give_each_layer_its_own_output(variant: str) -> None:
    torch.manual_seed(8)
    k = 512
    q4k = Q4KLinear.from_groups(decode_int4(q4_k_blocks(40, k), QuantType.Q4_K, 40, k),
                                torch.randn(40))
    q6k = Q6KLinear.from_blocks(decode_q6_k(q6_k_blocks(24, k), 24, k))
    q6kp = Q6KPLinear.from_blocks(decode_q6_k(q6_k_blocks(21, k), 21, k), torch.randn(21))
    q4 = Q4Linear.from_dense(torch.randn(17, k) * 0.05)
    q8 = Q8Linear.from_weight(torch.randn(33, k) * 0.05, torch.randn(33))
    layers = [q4k, q6k, q6kp, q4, q8]  # both roundings of the input, odd tile counts
    run = NativeCall(layers)
    for rows in (1, 3, 9, 17, 40):  # 40 rows: q4k on tiles in the amx variant
        x = torch.randn(1, rows, k)
        for layer, y in zip(layers, run(x), strict=True):
            assert torch.equal(y, layer(x))


def test_weights_moved_into_huge_pages_give_the_same_outputs(variant: str) -> None:
    torch.manual_seed(9)
    k = 512
    layers = [
        Q4KLinear.from_groups(decode_int4(q4_k_blocks(40, k), QuantType.Q4_K, 40, k)),
        Q6KLinear.from_blocks(decode_q6_k(q6_k_blocks(24, k), 24, k)),
        Q8Linear.from_weight(torch.randn(33, k) * 0.05, torch.randn(33)),
    ]
    x = torch.randn(3, k)
    before = [layer(x) for layer in layers]

    def arrays() -> list[torch.Tensor]:
        return [getattr(layer, name) for layer in layers for name in (*layer.BUFFERS, "bias")
                if getattr(layer, name) is not None]

    sizes = [t.numel() * t.element_size() for t in arrays()]
    assert len(sizes) == 2 + 3 + 3 and pages.to_huge_pages(layers) >= sum(sizes)
    starts = sorted(t.data_ptr() for t in arrays())
    assert starts[0] % pages.HUGE_PAGE == 0 and all(p % pages.ALIGN == 0 for p in starts)
    assert starts[-1] - starts[0] < sum(sizes) + pages.ALIGN * len(sizes)  # one arena
    for layer, expected in zip(layers, before, strict=True):
        assert torch.equal(layer(x), expected)


@pytest.mark.parametrize("k", [512, 768])  # 768: an odd number of q4k super-blocks
def test_every_form_gives_each_row_the_same_bits_from_1_to_64_rows(k: int, variant: str
                                                                   ) -> None:
    """A k-row call returns what k one-row calls of the same variant return, for every k
    from 1 to 64 and beyond (70 rows): one pass over the weights or balanced passes, and in
    the amx variant q4k's tiles from 32 rows on (whole and partial sets of 16 rows, a
    last tile of fewer than 16 output features)."""
    torch.manual_seed(10)
    layers = [
        q4_layer(40, k, True)[0],
        Q8Linear.from_weight(torch.randn(33, k) * 0.05, torch.randn(33)),
        Q4KLinear.from_groups(decode_int4(q4_k_blocks(40, k), QuantType.Q4_K, 40, k),
                              torch.randn(40)),
        Q6KLinear.from_blocks(decode_q6_k(q6_k_blocks(24, k), 24, k)),
        Q6KPLinear.from_blocks(decode_q6_k(q6_k_blocks(24, k), 24, k), torch.randn(24)),
    ]
    assert kernels.max_rows() == (16 if variant in ("avx512", "amx") else 8)
    x = torch.randn(70, k) * 2
    for layer in layers:
        alone = torch.cat([layer(x[i : i + 1]) for i in range(len(x))])  # [70, N]
        assert torch.equal(layer(x), alone), type(layer).__name__
        for m in range(1, 65):
            assert torch.equal(layer(x[:m]), alone[:m]), (type(layer).__name__, m)
        for m in (5, 16, 17, 35):
            assert torch.equal(layer(x[m : 2 * m]), alone[m : 2 * m]), (type(layer).__name__, m)


def test_amx_computes_the_bits_of_avx512() -> None:
    """The amx variant's tiles give q4k's exact group sums and repeat the AVX-512 loop's
    float steps, so both variants agree bit for bit at every row count."""
    for name in ("avx512", "amx"):
        reason = kernels.why_not(name)
        if reason is not None:
            pytest.skip(reason)
    torch.manual_seed(12)
    layers = [Q4KLinear.from_groups(decode_int4(q4_k_blocks(n, k), QuantType.Q4_K, n, k),
                                    torch.randn(n)) for n, k in ((37, 1536), (50, 768),
                                                                 (37, 4352))]
    layers.append(Q6KLinear.from_blocks(decode_q6_k(q6_k_blocks(24, 512), 24, 512)))
    layers.append(Q6KPLinear.from_blocks(decode_q6_k(q6_k_blocks(24, 512), 24, 512)))
    outs: dict[str, list[torch.Tensor]] = {}
    try:
        for name in ("avx512", "amx"):
            kernels.use(name)
            outs[name] = [layer(torch.randn(rows, layer.in_features,
                                            generator=torch.Generator().manual_seed(rows)) * 2)
                          for layer in layers for rows in (1, 8, 16, 33, 64)]
    finally:
        kernels.use(None)
    assert all(torch.equal(a, b) for a, b in zip(outs["avx512"], outs["amx"], strict=True))


def test_the_best_variant_runs_and_one_can_be_forced(monkeypatch: pytest.MonkeyPatch) -> None:
    kernels.reset()
    try:
        best = kernels.buildable()[-1]
        assert kernels.variant() == best
        monkeypatch.setenv("ANVE_KERNELS", "avx2")
        assert kernels.variant() == best  # the environment is read once ...
        kernels.reset()  # ... and again after a reset
        assert kernels.variant() == "avx2" and kernels.max_rows() == 8
        monkeypatch.setenv("ANVE_NATIVE", "0")  # off wins over a forced variant
        kernels.reset()
        assert kernels.variant() is None and not kernels.available()
        monkeypatch.delenv("ANVE_NATIVE")
        monkeypatch.setenv("ANVE_KERNELS", "sse9")
        kernels.reset()
        with pytest.raises(kernels.VariantError, match="unknown kernel variant 'sse9'"):
            kernels.library()
    finally:
        monkeypatch.delenv("ANVE_KERNELS", raising=False)
        kernels.reset()
    assert kernels.variant() == best


def test_forcing_a_variant_the_cpu_lacks_is_a_clear_error(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    monkeypatch.setattr(kernels, "cpu_flags", lambda: frozenset({"avx2", "fma", "f16c", "sse2"}))
    kernels.reset()
    try:
        assert kernels.supported() == ["avx2"] and kernels.variant() == "avx2"
        for name, flag in (("avx512", "avx512_vnni"), ("avxvnni", "avx_vnni"),
                           ("amx", "amx_int8")):
            assert flag in (kernels.why_not(name) or "")
            with pytest.raises(kernels.VariantError, match=f"lacks: .*{flag}"):
                kernels.use(name)
            monkeypatch.setenv("ANVE_KERNELS", name)
            kernels.reset()
            with pytest.raises(kernels.VariantError, match=f"'{name}' needs CPU flags"):
                kernels.available()
            monkeypatch.delenv("ANVE_KERNELS")
            kernels.reset()
        assert kernels.variant() == "avx2"
    finally:
        kernels.reset()


def test_variants_agree_within_the_rounding_of_their_sums() -> None:
    """Whatever their order of float sums, all variants compute the same numbers."""
    torch.manual_seed(11)
    k = 1536
    layer = Q4KLinear.from_groups(decode_int4(q4_k_blocks(64, k), QuantType.Q4_K, 64, k))
    x = torch.randn(5, k)
    outs = {}
    try:
        for name in kernels.buildable():
            kernels.use(name)
            outs[name] = layer(x)
    finally:
        kernels.use(None)
    expected = q4k_reference(x, layer)
    assert all(close(y, expected) for y in outs.values())
