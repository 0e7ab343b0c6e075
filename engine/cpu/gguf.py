"""GGUF 4-bit blocks -> per-group integer codes with an affine scale (exact decoding).

Contract: for a GGUF tensor in Q4_0, Q4_1 or Q4_K, :func:`decode_int4` returns a
:class:`GroupQuant` whose :meth:`GroupQuant.dequantize` is bit-identical to
``gguf.quants.dequantize`` of the same bytes: codes ``q`` in 0..15 and, per group of
32 consecutive input features, ``w = q * scale + offset`` evaluated in float32 with
the same operations as gguf-py (Q4_0: ``d * (q - 8)`` is ``q * d + (-8 d)``, exact;
Q4_1: ``d * q + m``; Q4_K: ``(d * sc) * q - dmin * m`` per 32-wide sub-block).

:class:`GGUFWeights` opens a GGUF file (:func:`read_gguf`, a fast header reader that
agrees with ``gguf.GGUFReader`` on tensors and scalar metadata), maps its tensor names
onto Hugging Face module names (``blk.3.attn_q.weight`` ->
``model.layers.3.self_attn.q_proj``) and applies the same row permutation transformers
applies to llama-arch ``attn_q`` / ``attn_k`` when loading, so the rows line up with
the loaded ``nn.Linear``.

Other formats (Q6_K, Q8_0, F16, F32, ...) have no exact group-32 int4 form;
:meth:`GGUFWeights.int4` returns ``None`` for them and the caller keeps them dense.
"""

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGMLQuantizationType

GROUP = 32  # input features per scale/offset pair

# GGUF per-layer tensor name -> Hugging Face module name inside ``model.layers.N``.
LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
PERMUTED_ARCHS = frozenset({"llama"})  # transformers' LlamaTensorProcessor


@dataclass(frozen=True)
class SuperBlocks:
    """Q4_K's own factors: per 256 inputs ``d`` and ``dmin``, per 32 a 6-bit scale and min.

    ``scale = d * sc`` and ``offset = -(dmin * mn)`` of the 32-group (float32 products).
    """

    d: torch.Tensor  # [N, K // 256] float32
    dmin: torch.Tensor  # [N, K // 256] float32
    sc: torch.Tensor  # [N, K // 32] int16, 0..63
    mn: torch.Tensor  # [N, K // 32] int16, 0..63

    def permute_rows(self, perm: torch.Tensor) -> "SuperBlocks":
        return SuperBlocks(self.d[perm], self.dmin[perm], self.sc[perm], self.mn[perm])


@dataclass(frozen=True)
class GroupQuant:
    """4-bit codes with one float32 scale and offset per group of 32 inputs.

    ``w[n, k] = q[n, k] * scale[n, k // 32] + offset[n, k // 32]``. Q4_K tensors also
    carry their integer structure (``superblocks``), which integer kernels use.
    """

    q: torch.Tensor  # [N, K] uint8, values 0..15
    scale: torch.Tensor  # [N, K // 32] float32
    offset: torch.Tensor  # [N, K // 32] float32
    superblocks: SuperBlocks | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.q.shape[0]), int(self.q.shape[1])

    def dequantize(self, rows: slice | torch.Tensor | None = None) -> torch.Tensor:
        """Dense float32 weight ``[N, K]`` (or the selected rows), as gguf computes it."""
        sel = slice(None) if rows is None else rows
        q = self.q[sel].float().unflatten(-1, (-1, GROUP))  # [n, G, 32]
        w = q * self.scale[sel].unsqueeze(-1) + self.offset[sel].unsqueeze(-1)
        return w.flatten(-2)  # [n, K]

    def permute_rows(self, perm: torch.Tensor) -> "GroupQuant":
        """The same weight with output rows reordered: row ``i`` becomes ``perm[i]``'s."""
        blocks = None if self.superblocks is None else self.superblocks.permute_rows(perm)
        return GroupQuant(self.q[perm], self.scale[perm], self.offset[perm], blocks)

    def kernel_scale_zero(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Scale and zero for a kernel computing ``(q - 8) * scale + zero``: ``[N, G]`` each."""
        return self.scale, self.offset + 8.0 * self.scale


def _f16(raw: np.ndarray) -> torch.Tensor:
    """Little-endian float16 bytes ``[..., 2]`` -> float32 ``[...]``."""
    return torch.from_numpy(np.ascontiguousarray(raw).view(np.float16)[..., 0].astype(np.float32))


def _nibbles(qs: np.ndarray, width: int) -> torch.Tensor:
    """Bytes ``[..., width * j]`` -> codes ``[..., j, 2 * width]``: low nibbles, then high."""
    b = torch.from_numpy(np.ascontiguousarray(qs)).unflatten(-1, (-1, width))  # [..., j, w]
    return torch.cat([b & 0x0F, b >> 4], dim=-1)  # [..., j, 2w]


def _blocks(data: np.ndarray, n: int, block_bytes: int) -> np.ndarray:
    """Raw tensor bytes -> ``[N, blocks per row, block_bytes]`` uint8."""
    return np.asarray(data, dtype=np.uint8).reshape(n, -1, block_bytes)


def decode_q4_0(data: np.ndarray, n: int, k: int) -> GroupQuant:
    """Q4_0 block (18 bytes): f16 ``d``, 16 bytes of codes; ``w = d * (q - 8)``."""
    b = _blocks(data, n, 18)  # [N, K/32, 18]
    d = _f16(b[..., 0:2])  # [N, K/32]
    q = _nibbles(b[..., 2:], 16).reshape(n, k)  # [N, K]
    return GroupQuant(q, d, -8.0 * d)


def decode_q4_1(data: np.ndarray, n: int, k: int) -> GroupQuant:
    """Q4_1 block (20 bytes): f16 ``d``, f16 ``m``, 16 bytes of codes; ``w = d * q + m``."""
    b = _blocks(data, n, 20)  # [N, K/32, 20]
    d, m = _f16(b[..., 0:2]), _f16(b[..., 2:4])  # [N, K/32] each
    q = _nibbles(b[..., 4:], 16).reshape(n, k)  # [N, K]
    return GroupQuant(q, d, m)


def q4_k_scale_min(scales: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K's 12 packed bytes ``[..., 12]`` -> 6-bit scales and mins ``[..., 8]`` each."""
    s = torch.from_numpy(np.ascontiguousarray(scales)).to(torch.int32)  # [..., 12]
    d, m, md = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc, mn


def decode_q4_k(data: np.ndarray, n: int, k: int) -> GroupQuant:
    """Q4_K super-block (144 bytes, 256 values = 8 sub-blocks of 32).

    f16 ``d``, f16 ``dmin``, 12 bytes of 6-bit (scale, min) pairs, 128 bytes of codes
    (each 32 bytes hold two sub-blocks: low nibbles, then high nibbles).
    ``w = (d * sc_j) * q - dmin * m_j`` for sub-block ``j``.
    """
    b = _blocks(data, n, 144)  # [N, K/256, 144]
    d, dmin = _f16(b[..., 0:2]), _f16(b[..., 2:4])  # [N, K/256]
    sc, mn = q4_k_scale_min(b[..., 4:16])  # [N, K/256, 8]
    scale = (d.unsqueeze(-1) * sc.float()).reshape(n, k // GROUP)  # [N, K/32]
    offset = -(dmin.unsqueeze(-1) * mn.float()).reshape(n, k // GROUP)  # [N, K/32]
    q = _nibbles(b[..., 16:], 32).reshape(n, k)  # [N, K]
    blocks = SuperBlocks(d, dmin, sc.to(torch.int16).reshape(n, k // GROUP),
                         mn.to(torch.int16).reshape(n, k // GROUP))
    return GroupQuant(q, scale, offset, blocks)


@dataclass(frozen=True)
class Q6Blocks:
    """A Q6_K tensor's integers: ``w = (d * sc) * q`` per 16 inputs, as gguf computes it."""

    q: torch.Tensor  # [N, K] int8, -32..31
    sc: torch.Tensor  # [N, K // 16] int8
    d: torch.Tensor  # [N, K // 256] float32

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.q.shape[0]), int(self.q.shape[1])

    def dequantize(self, rows: slice | torch.Tensor | None = None) -> torch.Tensor:
        """Dense float32 weight ``[N, K]`` (or the selected rows), bit-identical to gguf."""
        sel = slice(None) if rows is None else rows
        scale = self.d[sel].repeat_interleave(16, dim=-1) * self.sc[sel].float()  # [n, K/16]
        q = self.q[sel].float().unflatten(-1, (-1, 16))  # [n, K/16, 16]
        return (scale.unsqueeze(-1) * q).flatten(-2)

    def permute_rows(self, perm: torch.Tensor) -> "Q6Blocks":
        return Q6Blocks(self.q[perm], self.sc[perm], self.d[perm])


def decode_q6_k(data: np.ndarray, n: int, k: int) -> Q6Blocks:
    """Q6_K super-block (210 bytes, 256 values): 128 bytes of low 4 bits, 64 of high 2
    bits, 16 int8 scales (one per 16 values), f16 ``d``."""
    b = _blocks(data, n, 210).reshape(-1, 210)  # [N * K/256, 210]
    low_shift = np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    high_shift = np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    low = ((b[:, :128].reshape(-1, 2, 1, 64) >> low_shift) & 0x0F).reshape(-1, 8, 32)
    high = ((b[:, 128:192].reshape(-1, 2, 1, 32) >> high_shift) & 0x03).reshape(-1, 8, 32)
    q = (low | (high << 4)).astype(np.int8) - np.int8(32)  # [B, 8, 32] in input order
    sc = np.ascontiguousarray(b[:, 192:208]).view(np.int8)  # [B, 16]
    d = _f16(b[:, 208:210]).reshape(n, k // 256)
    return Q6Blocks(torch.from_numpy(q.reshape(n, k)), torch.from_numpy(sc.reshape(n, k // 16)), d)


INT4_DECODERS = {
    GGMLQuantizationType.Q4_0: decode_q4_0,
    GGMLQuantizationType.Q4_1: decode_q4_1,
    GGMLQuantizationType.Q4_K: decode_q4_k,
}


def decode_int4(data: np.ndarray, qtype: GGMLQuantizationType, n: int, k: int) -> GroupQuant:
    """Decode raw GGUF bytes of an ``[n, k]`` weight; raise ``ValueError`` if not 4-bit."""
    decoder = INT4_DECODERS.get(qtype)
    if decoder is None:
        raise ValueError(f"{qtype.name} has no exact group-{GROUP} int4 form")
    return decoder(data, n, k)


def llama_row_permutation(n_rows: int, n_head: int) -> torch.Tensor:
    """Row order transformers gives llama-arch ``attn_q``/``attn_k`` (its reverse permute).

    Loaded row ``i`` is GGUF row ``perm[i]``.
    """
    dim = n_rows // n_head // 2
    idx = torch.arange(n_rows).reshape(n_head, dim, 2)  # GGUF layout
    return idx.transpose(1, 2).reshape(n_rows)  # [N]


def hf_module_name(gguf_name: str) -> str | None:
    """``blk.N.attn_q.weight`` -> ``model.layers.N.self_attn.q_proj``; ``None`` if unknown."""
    parts = gguf_name.split(".")
    if parts[-1] != "weight":
        return None
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in LAYER_NAMES:
        return f"model.layers.{parts[1]}.{LAYER_NAMES[parts[2]]}"
    if gguf_name == "output.weight":
        return "lm_head"
    return None


_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}  # GGUF value type -> struct format
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor of a GGUF file: ggml shape (innermost first), format, raw bytes."""

    name: str
    shape: tuple[int, ...]  # ggml order: shape[0] is the row length K
    qtype: GGMLQuantizationType
    data: np.ndarray  # [rows, bytes per row] uint8, memory-mapped


class _Cursor:
    """Little-endian reads from a memory-mapped GGUF header."""

    def __init__(self, buf: np.ndarray) -> None:
        self.buf, self.view, self.pos = buf, memoryview(buf), 0  # type: ignore[arg-type]

    def scalar(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self.view, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.scalar("<Q")
        self.pos += n
        return bytes(self.view[self.pos - n : self.pos]).decode("utf-8", errors="replace")

    def skip_strings(self, count: int) -> None:
        unpack, view, pos = struct.Struct("<Q").unpack_from, self.view, self.pos
        for _ in range(count):
            pos += 8 + unpack(view, pos)[0]
        self.pos = pos

    def value(self, vtype: int) -> Any:
        """A value; arrays are skipped (returned as ``None``): the tokenizer's are huge."""
        if vtype == _STRING:
            return self.string()
        if vtype != _ARRAY:
            return self.scalar(_SCALARS[vtype])
        etype, count = self.scalar("<I"), self.scalar("<Q")
        if etype in _SCALARS:
            self.pos += count * struct.calcsize(_SCALARS[etype])
        elif etype == _STRING:
            self.skip_strings(count)
        else:
            for _ in range(count):
                self.value(etype)
        return None


def read_gguf(path: Path) -> tuple[dict[str, Any], dict[str, GGUFTensor]]:
    """Scalar metadata and tensors of a GGUF file (v2/v3, little-endian), memory-mapped.

    Equivalent to ``gguf.GGUFReader`` for what this module needs, without parsing the
    tokenizer arrays element by element (GGUFReader takes 14 s on Qwen 1.5B; this, 0.2 s).
    """
    buf = np.memmap(path, dtype=np.uint8, mode="r")
    cur = _Cursor(buf)
    magic, version = cur.scalar("<I"), cur.scalar("<I")
    if magic != GGUF_MAGIC or version not in (2, 3):
        raise ValueError(f"{path}: not a little-endian GGUF v2/v3 file")
    n_tensors, n_kv = cur.scalar("<Q"), cur.scalar("<Q")
    fields: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        fields[key] = cur.value(cur.scalar("<I"))
    infos = []
    for _ in range(n_tensors):
        name, n_dims = cur.string(), cur.scalar("<I")
        shape = tuple(cur.scalar("<Q") for _ in range(n_dims))
        infos.append((name, shape, GGMLQuantizationType(cur.scalar("<I")), cur.scalar("<Q")))
    align = int(fields.get("general.alignment", GGUF_DEFAULT_ALIGNMENT))
    start = -(-cur.pos // align) * align
    tensors = {}
    for name, shape, qtype, offset in infos:
        block, block_bytes = GGML_QUANT_SIZES[qtype]
        row_bytes = shape[0] // block * block_bytes
        rows = int(np.prod(shape[1:], dtype=np.int64))
        at = start + offset
        data = buf[at : at + rows * row_bytes].reshape(rows, row_bytes)
        tensors[name] = GGUFTensor(name, shape, qtype, data)
    return fields, tensors


class GGUFWeights:
    """The linear weights of a GGUF file, addressed by Hugging Face module name."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.fields, by_gguf_name = read_gguf(self.path)
        self.arch = str(self.fields["general.architecture"])
        self.n_head = int(self.fields[f"{self.arch}.attention.head_count"])
        self.n_kv_head = int(self.fields.get(f"{self.arch}.attention.head_count_kv", self.n_head))
        self.tensors: dict[str, GGUFTensor] = {}
        for t in by_gguf_name.values():
            name = hf_module_name(t.name)
            if name is not None:
                self.tensors[name] = t
        if "lm_head" not in self.tensors and "token_embd.weight" in by_gguf_name:
            self.tensors["lm_head"] = by_gguf_name["token_embd.weight"]  # tied embedding

    def qtype(self, module: str) -> GGMLQuantizationType | None:
        t = self.tensors.get(module)
        return None if t is None else t.qtype

    def shape(self, module: str) -> tuple[int, int]:
        """``(out_features, in_features)`` of the tensor behind ``module``."""
        k, n = (int(x) for x in self.tensors[module].shape)
        return n, k

    def row_permutation(self, module: str) -> torch.Tensor | None:
        """The row reordering transformers applied when loading ``module``, if any."""
        if self.arch not in PERMUTED_ARCHS:
            return None
        n, _ = self.shape(module)
        if module.endswith("q_proj"):
            return llama_row_permutation(n, self.n_head)
        if module.endswith("k_proj"):
            return llama_row_permutation(n, self.n_kv_head)
        return None

    def q6_k(self, module: str) -> Q6Blocks | None:
        """The integers of ``module``'s Q6_K weight in loaded row order, or ``None``."""
        if self.qtype(module) != GGMLQuantizationType.Q6_K:
            return None
        n, k = self.shape(module)
        blocks = decode_q6_k(self.tensors[module].data, n, k)
        perm = self.row_permutation(module)
        return blocks if perm is None else blocks.permute_rows(perm)

    def int4(self, module: str) -> GroupQuant | None:
        """Exact int4 form of ``module``'s weight in loaded row order, or ``None``."""
        qtype = self.qtype(module)
        if qtype not in INT4_DECODERS:
            return None
        n, k = self.shape(module)
        g = decode_int4(self.tensors[module].data, qtype, n, k)
        perm = self.row_permutation(module)
        return g if perm is None else g.permute_rows(perm)
