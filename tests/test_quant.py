"""GGUF 4-bit block decoding: exact against gguf's own dequantize, names, row order."""

import functools
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QuantType
from gguf import GGUFReader, GGUFWriter, quants
from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

from engine.cpu.gguf import (
    GGUFWeights,
    decode_int4,
    hf_module_name,
    llama_row_permutation,
    q4_k_scale_min,
    read_gguf,
)
from engine.models import registry

RNG = np.random.default_rng(0)


def random_f16_bytes(shape: tuple[int, ...], scale: float = 0.02) -> np.ndarray:
    """Finite float16 values (some negative) as raw bytes ``[..., 2]``."""
    return (RNG.standard_normal(shape) * scale).astype(np.float16).view(np.uint8).reshape(*shape, 2)


def q4_k_blocks(n: int, k: int, scale: float = 0.02) -> np.ndarray:
    """Random but valid Q4_K bytes for an ``[n, k]`` weight: every bit pattern of the
    scales and codes, random finite f16 ``d`` and ``dmin`` of about ``scale``."""
    nb = k // 256
    d = random_f16_bytes((n, nb, 1), scale).reshape(n, nb, 2)
    dmin = random_f16_bytes((n, nb, 1), scale).reshape(n, nb, 2)
    rest = RNG.integers(0, 256, size=(n, nb, 140), dtype=np.uint8)  # 12 scale + 128 code
    return np.concatenate([d, dmin, rest], axis=-1).reshape(n, nb * 144)


def q6_k_blocks(n: int, k: int, scale: float = 0.01) -> np.ndarray:
    """Random but valid Q6_K bytes: every bit pattern of codes and scales, f16 ``d``."""
    nb = k // 256
    rest = RNG.integers(0, 256, size=(n, nb, 208), dtype=np.uint8)
    d = random_f16_bytes((n, nb, 1), scale).reshape(n, nb, 2)
    return np.concatenate([rest, d], axis=-1).reshape(n, nb * 210)


def reference(data: np.ndarray, qtype: QuantType) -> torch.Tensor:
    return torch.from_numpy(quants.dequantize(data, qtype))


@pytest.mark.parametrize("qtype", [QuantType.Q4_0, QuantType.Q4_1])
def test_q4_0_and_q4_1_decode_exactly_like_gguf(qtype: QuantType) -> None:
    n, k = 24, 96
    w = (RNG.standard_normal((n, k)) * 0.05).astype(np.float32)
    data = quants.quantize(w, qtype)  # [n, k / 32 * bytes per block]
    g = decode_int4(data, qtype, n, k)
    assert g.q.shape == (n, k) and g.scale.shape == (n, k // 32) and int(g.q.max()) <= 15
    assert torch.equal(g.dequantize(), reference(data, qtype))


def test_q4_1_random_bytes_decode_exactly() -> None:
    n, k = 8, 64
    dm = random_f16_bytes((n, k // 32, 2)).reshape(n, k // 32, 4)
    codes = RNG.integers(0, 256, size=(n, k // 32, 16), dtype=np.uint8)
    data = np.concatenate([dm, codes], axis=-1).reshape(n, -1)
    g = decode_int4(data, QuantType.Q4_1, n, k)
    assert torch.equal(g.dequantize(), reference(data, QuantType.Q4_1))


def test_q4_k_decode_exactly_like_gguf() -> None:
    n, k = 16, 512
    data = q4_k_blocks(n, k)
    g = decode_int4(data, QuantType.Q4_K, n, k)
    assert torch.equal(g.dequantize(), reference(data, QuantType.Q4_K))
    rows = torch.tensor([3, 0, 15])
    assert torch.equal(g.dequantize(rows), reference(data, QuantType.Q4_K)[rows])


def test_q4_k_scale_unpacking_matches_gguf() -> None:
    packed = RNG.integers(0, 256, size=(50, 12), dtype=np.uint8)
    sc, mn = q4_k_scale_min(packed)
    ref_sc, ref_mn = quants.Q4_K.get_scale_min(packed)
    assert np.array_equal(sc.numpy(), ref_sc) and np.array_equal(mn.numpy(), ref_mn)
    assert int(sc.max()) <= 63 and int(mn.max()) <= 63


def test_kernel_scale_zero_reproduces_the_affine_form() -> None:
    data = q4_k_blocks(4, 256)
    g = decode_int4(data, QuantType.Q4_K, 4, 256)
    scale, zero = g.kernel_scale_zero()
    q = g.q.double().unflatten(-1, (-1, 32))
    w = ((q - 8) * scale.double()[..., None] + zero.double()[..., None]).flatten(-2)
    assert torch.allclose(w, g.dequantize().double(), rtol=0, atol=1e-6)


def test_other_formats_have_no_int4_form() -> None:
    with pytest.raises(ValueError, match="Q6_K"):
        decode_int4(np.zeros((1, 210), np.uint8), QuantType.Q6_K, 1, 256)


def test_llama_row_permutation_is_transformers_reverse_permute() -> None:
    for n_rows, n_head in [(64, 4), (48, 3), (192, 3)]:
        rows = np.arange(n_rows * 2, dtype=np.float32).reshape(n_rows, 2)
        ref = LlamaTensorProcessor()._reverse_permute_weights(rows, n_head, n_head)
        perm = llama_row_permutation(n_rows, n_head)
        assert np.array_equal(rows[perm.numpy()], ref)


def test_gguf_names_map_to_hf_modules() -> None:
    assert hf_module_name("blk.3.attn_q.weight") == "model.layers.3.self_attn.q_proj"
    assert hf_module_name("blk.12.ffn_down.weight") == "model.layers.12.mlp.down_proj"
    assert hf_module_name("blk.0.attn_output.weight") == "model.layers.0.self_attn.o_proj"
    assert hf_module_name("output.weight") == "lm_head"
    assert hf_module_name("blk.0.attn_q.bias") is None
    assert hf_module_name("blk.0.attn_norm.weight") is None
    assert hf_module_name("token_embd.weight") is None


def write_gguf(path: Path, arch: str, tensors: dict[str, tuple[np.ndarray, QuantType]]) -> Path:
    """A minimal GGUF: architecture, head counts, and the given raw tensors."""
    writer = GGUFWriter(path, arch)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    for name, (data, qtype) in tensors.items():
        writer.add_tensor(name, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_gguf_weights_reorders_llama_q_and_k_rows(tmp_path: Path) -> None:
    n, k = 64, 64
    q_data = quants.quantize(RNG.standard_normal((n, k)).astype(np.float32), QuantType.Q4_1)
    k_data = quants.quantize(RNG.standard_normal((32, k)).astype(np.float32), QuantType.Q4_1)
    tensors = {
        "blk.0.attn_q.weight": (q_data, QuantType.Q4_1),
        "blk.0.attn_k.weight": (k_data, QuantType.Q4_1),
    }
    for arch, permuted in [("llama", True), ("qwen2", False)]:
        weights = GGUFWeights(write_gguf(tmp_path / f"{arch}.gguf", arch, tensors))
        assert weights.shape("model.layers.0.self_attn.q_proj") == (n, k)
        processor = LlamaTensorProcessor({"num_attention_heads": 4, "num_key_value_heads": 2})
        for name, data in [("attn_q", q_data), ("attn_k", k_data)]:
            dense = quants.dequantize(data, QuantType.Q4_1)
            if permuted:
                dense = processor.process(dense, f"blk.0.{name}.weight").weights
            module = "model.layers.0.self_attn." + {"attn_q": "q_proj", "attn_k": "k_proj"}[name]
            g = weights.int4(module)
            assert g is not None and torch.equal(g.dequantize(), torch.from_numpy(dense))


@functools.cache
def light_gguf() -> GGUFWeights:
    """The light model's GGUF (Q4_1 layers, Q8_0 tied embedding), opened once."""
    spec = registry.get_spec("smollm2-135m-instruct")
    return GGUFWeights(registry.locate_part(spec.parts[0], spec))


def assert_reads_like_gguf_reader(path: Path) -> None:
    fields, tensors = read_gguf(path)
    reader = GGUFReader(path)
    assert list(tensors) == [t.name for t in reader.tensors]
    for t in reader.tensors:
        mine = tensors[t.name]
        assert mine.shape == tuple(int(x) for x in t.shape) and mine.qtype == t.tensor_type
        assert np.array_equal(mine.data.reshape(-1), t.data.view(np.uint8).reshape(-1))
    for key, field in reader.fields.items():
        if key in fields and fields[key] is not None:
            assert fields[key] == field.contents(), key


def test_fast_header_reader_agrees_with_gguf_reader(tmp_path: Path) -> None:
    data = quants.quantize(RNG.standard_normal((8, 64)).astype(np.float32), QuantType.Q4_1)
    dense = RNG.standard_normal((3, 5)).astype(np.float32)
    writer = GGUFWriter(tmp_path / "t.gguf", "llama")
    writer.add_head_count(4)
    writer.add_token_list(["a", "bc", "déf"])
    writer.add_tensor("blk.0.attn_q.weight", data, raw_dtype=QuantType.Q4_1)
    writer.add_tensor("blk.0.attn_norm.weight", dense)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert_reads_like_gguf_reader(tmp_path / "t.gguf")
    fields, _ = read_gguf(tmp_path / "t.gguf")
    assert fields["llama.attention.head_count"] == 4 and fields["general.architecture"] == "llama"


@pytest.mark.model
def test_fast_header_reader_agrees_on_the_light_model() -> None:
    assert_reads_like_gguf_reader(light_gguf().path)


@pytest.mark.model
def test_real_smollm2_tensor_decodes_exactly() -> None:
    weights = light_gguf()
    assert weights.arch == "llama" and weights.qtype("model.layers.0.mlp.up_proj") == QuantType.Q4_1
    assert weights.qtype("lm_head") == QuantType.Q8_0  # tied to the Q8_0 token embedding
    assert weights.int4("lm_head") is None
    tensor = weights.tensors["model.layers.0.mlp.up_proj"]
    n, k = weights.shape("model.layers.0.mlp.up_proj")
    g = decode_int4(tensor.data, QuantType.Q4_1, n, k)
    assert torch.equal(g.dequantize(), reference(tensor.data, QuantType.Q4_1))
