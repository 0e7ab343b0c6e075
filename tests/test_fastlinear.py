"""Fast CPU linear layers: same function as the reference, and identical greedy tokens."""

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as QuantType
from gguf import quants
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

from engine.cpu import kernels
from engine.cpu.gguf import decode_int4
from engine.cpu.layers import (
    SMALL_ROWS,
    FastLinear,
    Int4Linear,
    Int8Linear,
    Q4Linear,
    QuantizedLinear,
)
from engine.cpu.quantize import (
    CACHE_FORMAT,
    CACHE_LINE,
    AccelerationReport,
    accelerate,
    aligned,
    cache_path,
    model_bytes,
)
from engine.spec.runner import ModelRunner
from tests.test_quant import light_gguf, q4_k_blocks, q6_k_blocks, write_gguf
from tests.tiny import tiny_model

RNG = np.random.default_rng(1)
# torch's int4/int8 kernels, and ours where they run (AVX2 and a compiler: CI has both)
NATIVE = [False, pytest.param(True, marks=pytest.mark.skipif(
    not kernels.available(), reason="native kernels need AVX2, FMA, F16C and a C++ compiler"))]


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())


@pytest.mark.parametrize("bias", [False, True])
def test_fast_linear_matches_f_linear_for_every_row_count(bias: bool) -> None:
    torch.manual_seed(0)
    linear = nn.Linear(96, 80, bias=bias)
    fast = FastLinear(linear)
    assert fast.weight is linear.weight
    for rows in [1, 2, 3, 4, 7, 8, SMALL_ROWS, SMALL_ROWS + 1, 100]:
        x = torch.randn(1, rows, 96)  # [B, T, K]
        y = fast(x)
        assert y.shape == (1, rows, 80)
        b = None if linear.bias is None else linear.bias.double()
        ref = F.linear(x.double(), linear.weight.double(), b)
        assert torch.allclose(y.double(), ref, rtol=1e-5, atol=1e-5)
        assert torch.allclose(y, F.linear(x, linear.weight, linear.bias), rtol=1e-5, atol=1e-6)


def test_int4_linear_computes_x_times_dequantized_weight() -> None:
    n, k = 64, 512
    data = q4_k_blocks(n, k)
    g = decode_int4(data, QuantType.Q4_K, n, k)
    bias = torch.randn(n)
    layer = Int4Linear.from_groups(g, bias)
    w = torch.from_numpy(quants.dequantize(data, QuantType.Q4_K))  # [N, K]
    # The kernel's weight: gguf's up to bf16 rounding of scale and zero.
    assert relative_error(layer.dequantized(), w) < 2**-7
    for rows in [1, 2, 4, 8, 40]:
        x = torch.randn(1, rows, k)  # [B, T, K]
        expected = x.double() @ w.double().T + bias.double()
        assert relative_error(layer(x), expected) < 2e-2
        assert layer(x).dtype == torch.float32


def test_int4_linear_on_a_real_shape_of_q4_1() -> None:
    n, k = 96, 192
    w = (RNG.standard_normal((n, k)) * 0.05).astype(np.float32)
    data = quants.quantize(w, QuantType.Q4_1)
    layer = Int4Linear.from_groups(decode_int4(data, QuantType.Q4_1, n, k))
    dense = torch.from_numpy(quants.dequantize(data, QuantType.Q4_1))
    x = torch.randn(3, k)
    assert relative_error(layer(x), x.double() @ dense.double().T) < 2e-2


def test_int8_linear_is_a_close_approximation() -> None:
    linear = nn.Linear(128, 48)
    layer = Int8Linear.from_weight(linear.weight, linear.bias)
    x = torch.randn(5, 128)
    assert relative_error(layer(x), linear(x).detach()) < 3e-2


def greedy_tokens(
    model: nn.Module, prompt: list[int], steps: int, draft_every: int = 0
) -> list[int]:
    """Greedy continuation; with ``draft_every`` it also runs multi-row forwards and
    rolls them back, as verification does."""
    runner = ModelRunner(model)
    logits = runner.sync(prompt)
    assert logits is not None
    out = [int(logits.argmax())]
    for i in range(steps):
        if draft_every and i % draft_every == 0:
            base = len(runner)
            runner.forward([out[-1], 5, 6, 7], rows=4)
            runner.truncate(base)
        out.append(int(runner.forward([out[-1]])[-1].argmax()))
    return out


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_fp32_mode_gives_identical_greedy_tokens(kind: str) -> None:
    prompt = [3, 17, 42, 99, 7, 250, 11]
    model = tiny_model(kind, dtype=torch.float32, scale=4.0)
    reference = greedy_tokens(model, prompt, 24)
    ref_logits = ModelRunner(model).forward(prompt, rows=len(prompt))
    report = accelerate(model, None, "fp32")
    assert report.layers["fp32"] == 2 * 7 + 1
    assert not any(type(m) is nn.Linear for m in model.modules())
    logits = ModelRunner(model).forward(prompt, rows=len(prompt))
    assert torch.allclose(logits, ref_logits, rtol=1e-4, atol=1e-4)
    assert greedy_tokens(model, prompt, 24) == reference
    assert greedy_tokens(model, prompt, 24, draft_every=3) == reference


def test_modes_are_checked() -> None:
    model = tiny_model("llama", dtype=torch.float32)
    with pytest.raises(ValueError, match="mode"):
        accelerate(model, None, "int3")
    with pytest.raises(ValueError, match="GGUF"):
        accelerate(model, None, "int4")
    before = model_bytes(model)
    assert accelerate(model, None, "off").weight_bytes == before


def int4_layers(report: AccelerationReport) -> int:
    return sum(report.layers[k] for k in ("int4", "q4", "q4k"))


def wide_model(kind: str = "llama") -> nn.Module:
    """A 2-layer llama or qwen2 wide enough (K = 256, 512) for Q4_K super-blocks."""
    torch.manual_seed(0)
    config_class, model_class = {
        "llama": (LlamaConfig, LlamaForCausalLM),
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    }[kind]
    config = config_class(
        vocab_size=320,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    return model_class(config).float().eval()


GGUF_LAYOUT = [  # (GGUF tensor, HF module, format)
    ("blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj", QuantType.Q4_1),
    ("blk.0.attn_k.weight", "model.layers.0.self_attn.k_proj", QuantType.Q4_K),
    ("blk.0.ffn_up.weight", "model.layers.0.mlp.up_proj", QuantType.Q4_K),
    ("blk.1.ffn_down.weight", "model.layers.1.mlp.down_proj", QuantType.Q4_K),
    ("blk.1.attn_v.weight", "model.layers.1.self_attn.v_proj", QuantType.Q8_0),
    ("blk.0.ffn_down.weight", "model.layers.0.mlp.down_proj", QuantType.Q6_K),
    ("output.weight", "lm_head", QuantType.Q4_0),
]


def gguf_model(tmp_path: Path, kind: str = "llama") -> tuple[nn.Module, Path]:
    """A model whose weights in ``GGUF_LAYOUT`` come from GGUF blocks, loaded the way
    transformers loads them (llama: q/k rows reverse-permuted), and that GGUF file."""
    model = wide_model(kind)
    processor = LlamaTensorProcessor({"num_attention_heads": 4, "num_key_value_heads": 2})
    tensors = {}
    for gguf_name, module, qtype in GGUF_LAYOUT:
        linear = model.get_submodule(module)
        n, k = linear.weight.shape
        if qtype == QuantType.Q4_K:
            data = q4_k_blocks(n, k, 1e-4)
        elif qtype == QuantType.Q6_K:  # gguf-py has no Q6_K quantizer
            data = q6_k_blocks(n, k, 1e-5)
        else:
            data = quants.quantize(linear.weight.detach().numpy(), qtype)
        dense = quants.dequantize(data, qtype)
        if kind == "llama":
            dense = processor.process(dense, gguf_name).weights
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(np.ascontiguousarray(dense)))
        tensors[gguf_name] = (data, qtype)
    return model, write_gguf(tmp_path / f"{kind}.gguf", kind, tensors)


def accelerated(tmp_path: Path, kind: str, native: bool) -> nn.Module:
    """:func:`gguf_model` on the int4+int8 layers (our kernels where ``native``)."""
    model, path = gguf_model(tmp_path, kind)
    accelerate(model, path, "int4+int8", native=native)
    return model


@pytest.mark.parametrize("native", NATIVE)
@pytest.mark.parametrize("mode", ["int4", "int4+int8"])
def test_int4_mode_runs_the_gguf_codes_close_to_the_dense_model(
    tmp_path: Path, mode: str, native: bool
) -> None:
    model, path = gguf_model(tmp_path)
    x = torch.tensor([[3, 17, 42, 99, 7, 250, 11]])
    with torch.no_grad():
        reference = model(x).logits
    report = accelerate(model, path, mode, native=native)
    int8 = "q8" if native else "int8"
    assert int4_layers(report) == 5 and not report.fallbacks
    if native:  # the three Q4_K tensors in their own integer form
        assert report.layers["q4k"] == 3
    q6 = kernels.q6k_form()  # the form the running variant loads Q6_K tensors in
    assert report.layers[q6] == (1 if native else 0)  # exact on our kernels
    rest = int8 if mode == "int4+int8" else "fp32"
    assert report.layers[rest] == 2 * 7 + 1 - 5 - report.layers[q6]
    layer = model.get_submodule("model.layers.0.self_attn.q_proj")
    assert isinstance(layer, Q4Linear if native else Int4Linear)
    assert model.get_output_embeddings().weight.shape == (320, 256)  # shape-only stand-in
    # bfloat16 activations (torch's kernels) or 8-bit ones per 32/256 inputs (ours)
    with torch.no_grad():
        assert relative_error(model(x).logits, reference) < (3e-2 if native else 2e-2)


@pytest.mark.parametrize("native", NATIVE)
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_int4_int8_mode_verifies_exactly_what_decoding_computes(
    tmp_path: Path, kind: str, native: bool
) -> None:
    model, path = gguf_model(tmp_path, kind)
    assert accelerate(model, path, "int4+int8", native=native).row_invariant
    runner = ModelRunner(model)
    runner.sync([3, 17, 42, 99, 7, 250, 11, 60])
    base, new = len(runner), [5, 77, 300, 12, 9, 100, 42, 8]
    one_by_one = torch.stack([runner.forward([t])[-1] for t in new])  # [8, V]
    for k in [2, 4, 5, 8]:  # our kernels: 8 rows per pass; torch's int4: 4
        runner.truncate(base)
        assert torch.equal(runner.forward(new[:k], rows=k), one_by_one[:k])
    assert greedy_tokens(model, [3, 17, 42], 16, draft_every=2) == greedy_tokens(
        model, [3, 17, 42], 16
    )


@pytest.mark.parametrize("native", NATIVE)
def test_int4_mode_keeps_a_layer_dense_when_the_codes_do_not_match(
    tmp_path: Path, native: bool
) -> None:
    model, path = gguf_model(tmp_path)
    with torch.no_grad():
        model.get_submodule("model.layers.0.mlp.up_proj").weight.mul_(1.5)
    report = accelerate(model, path, "int4", native=native)
    assert report.fallbacks == ["model.layers.0.mlp.up_proj"]
    assert isinstance(model.get_submodule("model.layers.0.mlp.up_proj"), FastLinear)
    assert int4_layers(report) == 4


@pytest.mark.model
@pytest.mark.parametrize("native", NATIVE)
def test_light_model_int4_layers_match_gguf_dequantize(native: bool) -> None:
    weights = light_gguf()
    name = "model.layers.2.self_attn.q_proj"  # permuted rows
    g = weights.int4(name)
    assert g is not None
    tensor = weights.tensors[name]
    dense = quants.dequantize(tensor.data, tensor.qtype)
    dense = (
        LlamaTensorProcessor(
            {"num_attention_heads": weights.n_head, "num_key_value_heads": weights.n_kv_head}
        )
        .process(dense, tensor.name)
        .weights
    )
    w = torch.from_numpy(np.ascontiguousarray(dense))  # [N, K] as transformers loads it
    layer = (Q4Linear if native else Int4Linear).from_groups(g)
    x = torch.randn(4, w.shape[1])
    assert relative_error(layer(x), x.double() @ w.double().T) < 2e-2


@pytest.mark.parametrize("native", NATIVE)
def test_converted_layers_are_cached_and_reloaded(tmp_path: Path, native: bool) -> None:
    model, path = gguf_model(tmp_path)
    x = torch.tensor([[3, 17, 42, 99, 7]])
    folder = tmp_path / "accelerated"
    first = accelerate(model, path, "int4+int8", cache_dir=folder, native=native)
    cached = cache_path(folder, "int4+int8", torch.float32, native)
    assert cached.is_file() and not first.from_cache
    assert not cache_path(folder, "int4+int8", torch.float32, not native).exists()
    with torch.no_grad():
        expected = model(x).logits
    again, _ = gguf_model(tmp_path)
    second = accelerate(again, path, "int4+int8", cache_dir=folder, native=native)
    assert second.from_cache and second.layers == first.layers and second.row_invariant
    if not native:  # torch's int8 kernel crashed on a weight at the file's own offset
        held = [b for m in again.modules() if isinstance(m, QuantizedLinear)
                for b in m.buffers()]
        assert held and all(b.data_ptr() % CACHE_LINE == 0 for b in held)
    with torch.no_grad():
        assert torch.equal(again(x).logits, expected)


def test_q6_k_loads_in_the_running_variants_form_and_either_form_gives_the_same_logits(
    tmp_path: Path, variant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Q6_K tensors load as q6kp where the variant prefers it (6-bit codes), cached in a
    file of their own; the other form, forced, gives the very same logits."""
    x = torch.tensor([[3, 17, 42, 99, 7]])
    folder = tmp_path / "accelerated"
    preferred = kernels.q6k_form()
    assert preferred == ("q6kp" if variant in ("avx512", "amx") else "q6k")
    base, path = gguf_model(tmp_path)
    logits, kinds = [], []
    for form in (preferred, "q6kp" if preferred == "q6k" else "q6k"):
        monkeypatch.setattr(kernels, "q6k_form", lambda form=form: form)
        model = copy.deepcopy(base)
        report = accelerate(model, path, "int4+int8", cache_dir=folder, native=True)
        assert report.layers[form] == 1 and not report.from_cache
        cached = cache_path(folder, "int4+int8", torch.float32, True)
        assert cached.is_file() and ("-q6kp-" in cached.name) == (form == "q6kp")
        kinds.append({type(m).__name__ for m in model.modules()} & {"Q6KLinear", "Q6KPLinear"})
        with torch.no_grad():
            logits.append(model(x).logits)
    assert sorted(k for ks in kinds for k in ks) == ["Q6KLinear", "Q6KPLinear"]
    assert torch.equal(logits[0], logits[1])


def test_aligned_copies_only_what_is_off_a_cache_line() -> None:
    memory = torch.zeros(4 * CACHE_LINE, dtype=torch.int8)
    start = -memory.data_ptr() % CACHE_LINE
    on_line, off_line = memory[start : start + 64], memory[start + 11 : start + 75]
    assert aligned(on_line) is on_line
    moved = aligned(off_line)
    assert moved.data_ptr() % CACHE_LINE == 0 and torch.equal(moved, off_line)


def test_writing_a_cache_removes_the_same_builds_older_formats(tmp_path: Path) -> None:
    model, path = gguf_model(tmp_path)
    folder = tmp_path / "accelerated"
    current = cache_path(folder, "int4+int8", torch.float32)
    stem = current.name.rpartition("-v")[0]
    folder.mkdir()
    older = [folder / f"{stem}-v{v}.safetensors" for v in range(1, CACHE_FORMAT)]
    kept = [folder / f"{stem}-v{CACHE_FORMAT + 1}.safetensors",  # a newer build's
            cache_path(folder, "int4", torch.float32).with_name("other-v1.safetensors"),
            folder / f"{stem.replace('int4-int8', 'int4')}-v1.safetensors"]  # another mode's
    for file in older + kept:
        file.write_bytes(b"old")
    accelerate(model, path, "int4+int8", cache_dir=folder, native=False)
    assert current.is_file() and not any(f.exists() for f in older)
    assert all(f.read_bytes() == b"old" for f in kept)


def test_a_cache_of_either_q6_k_form_replaces_both_forms_older_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A machine whose kernels moved to q6kp leaves no older cache of the byte form behind
    (nor the other way round); the other form's current file stays."""
    if not kernels.available():
        pytest.skip("native kernels need AVX2, FMA, F16C and a C++ compiler")
    model, path = gguf_model(tmp_path)
    folder = tmp_path / "accelerated"
    forms = {f: cache_path(folder, "int4+int8", torch.float32, True, q6k_form=f)
             for f in ("q6k", "q6kp")}
    folder.mkdir()
    older = [p.with_name(p.name.replace(f"-v{CACHE_FORMAT}.", f"-v{CACHE_FORMAT - 1}."))
             for p in forms.values()]
    for file in [*older, forms["q6k"]]:
        file.write_bytes(b"old")
    monkeypatch.setattr(kernels, "q6k_form", lambda: "q6kp")
    accelerate(model, path, "int4+int8", cache_dir=folder, native=True)
    assert forms["q6kp"].is_file() and not any(f.exists() for f in older)
    assert forms["q6k"].read_bytes() == b"old"


def test_a_cache_that_does_not_fit_is_rebuilt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model, path = gguf_model(tmp_path)
    cache_path(tmp_path, "int4", torch.float32).write_bytes(b"not safetensors")
    report = accelerate(model, path, "int4", cache_dir=tmp_path, native=False)
    assert not report.from_cache and report.layers["int4"] == 5
    assert "ignoring the cache" in caplog.text
    again, _ = gguf_model(tmp_path)
    assert accelerate(again, path, "int4", cache_dir=tmp_path, native=False).from_cache
    other, other_path = gguf_model(tmp_path, "qwen2")  # another GGUF, same cache folder
    assert not accelerate(other, other_path, "int4", cache_dir=tmp_path, native=False).from_cache
