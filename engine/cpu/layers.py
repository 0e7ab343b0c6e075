"""Fast CPU linear layers for decoding and verification.

Contract of the layers (each replaces one ``nn.Linear``; input ``[..., K]``, output
``[..., N]`` in the input's dtype):

* :class:`FastLinear` keeps the same float weight and computes ``x @ W.T + b``. For
  a few rows (2..``SMALL_ROWS``) it uses ``(W @ x.T).T``, which costs about as much as
  one row where ``F.linear``'s kernel choice costs several times that (timings:
  docs/measurements.md). Outputs equal ``F.linear``
  within float32 rounding (a different summation order, not bit-identical).
* :class:`Int4Linear` runs torch's CPU kernel ``_weight_int4pack_mm_for_cpu`` on the
  GGUF's own 4-bit codes (:mod:`engine.cpu.gguf`), group 32, dequantizing as
  ``(q - 8) * scale + zero``. The kernel's fast path wants bfloat16 activations and
  bfloat16 scale/zero, so compared with the GGUF's float32 dequantization the
  differences are: scale and zero rounded to bfloat16 (measured on Qwen Q4_K and
  SmolLM2 Q4_1: weights within 5 % of a quantization step, 0.2 % RMS), the input
  rounded to bfloat16, and the output rounded to bfloat16 before the bias is added
  in the input's dtype (llama.cpp itself rounds activations to 8 bits for these dot
  products).
* :class:`Int8Linear` (for tensors with no exact int4 form, e.g. Q6_K, Q8_0) is a
  per-output-channel symmetric int8 re-quantization of the dense weight run by
  ``_weight_int8pack_mm`` in bfloat16: an approximation, error <= max|W_row| / 254
  (measured on Qwen Q6_K: 1 % RMS, 0.15-0.2 of a Q6_K step).

* :class:`Q4Linear` and :class:`Q8Linear` are the same two weight forms run by our own
  kernels (:mod:`engine.cpu.kernels`, where they can run: AVX2 and a compiler), faster
  than torch's at 1-16 rows. Q4: the GGUF's codes with scale and offset rounded to
  float16 (11-bit mantissa, vs bfloat16's 8 above); Q8: the int8 codes above with a
  float32 scale. Both round the activations to int8 per group of 32 inputs (one float
  scale each, as llama.cpp rounds activations for its quantized dot products): about
  0.5 % relative error on a layer's output, and every group's product is exact
  integer arithmetic. :class:`Q4KLinear` and :class:`Q6KLinear` hold Q4_K and Q6_K
  tensors exactly (their integer scales, the GGUF's float16 ``d``) and round activations per 256
  inputs, as llama.cpp's K-quant dot products do; fewer instructions per row.
  :class:`Q6KPLinear` holds the same Q6_K weights with 6-bit codes (the GGUF's bytes) and
  gives :class:`Q6KLinear`'s bits; which of the two a model loads is the kernel
  variant's choice (:func:`kernels.q6k_form`).

Row independence: the four quantized layers give each output row the same bits
whatever the number of rows (their kernels reduce each row on its own);
``FastLinear`` does not (float32 BLAS picks different kernels for 1 and k rows).
:mod:`engine.cpu.quantize` swaps these layers into a loaded model.
"""

from collections.abc import Sequence
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from engine.cpu import formats, kernels
from engine.cpu.gguf import GROUP, GroupQuant, Q6Blocks

SMALL_ROWS = 32  # up to this many rows FastLinear computes (W @ x.T).T
KERNEL_DTYPE = torch.bfloat16  # the int4/int8 kernels' fast path on AVX2


class FastLinear(nn.Module):
    """``nn.Linear`` with a small-batch-friendly product; shares the original weight."""

    FORMAT = "fp32"

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight  # [N, K], the same Parameter (tied weights stay tied)
        self.bias = linear.bias  # [N] or None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if rows <= 1 or rows > SMALL_ROWS:
            return F.linear(x, self.weight, self.bias)
        x2 = x.reshape(rows, self.in_features)  # [M, K]
        y = torch.mm(self.weight, x2.t()).t().contiguous()  # [M, N]
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)


def _bias_copy(bias: torch.Tensor | None) -> torch.Tensor | None:
    return None if bias is None else bias.detach().clone()


class QuantizedLinear(nn.Module):
    """Shared by the quantized layers: sizes, and a shape-only ``weight``."""

    BUFFERS: tuple[str, ...]  # the weight buffers, in constructor order (bias last)
    in_features: int
    out_features: int

    @property
    def weight(self) -> torch.Tensor:
        """A meta tensor ``[N, K]``: code may ask ``lm_head.weight.shape``, not compute."""
        return torch.empty(self.out_features, self.in_features, device="meta")

    def _hold(self, shape: tuple[int, int], **buffers: torch.Tensor | None) -> None:
        """Record ``(out_features, in_features)`` and register the buffers, in order."""
        self.out_features, self.in_features = shape
        for name, tensor in buffers.items():
            self.register_buffer(name, tensor)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}"


class Int4Linear(QuantizedLinear):
    """A linear layer on 4-bit codes with group-32 scale and zero (torch CPU kernel)."""

    BUFFERS = ("packed", "scale_zero")
    packed: torch.Tensor  # [N, K / 2] uint8, the kernel's layout
    scale_zero: torch.Tensor  # [K / 32, N, 2] in the kernel dtype
    bias: torch.Tensor | None  # [N]

    FORMAT = "int4"

    def __init__(
        self, packed: torch.Tensor, scale_zero: torch.Tensor, bias: torch.Tensor | None = None
    ) -> None:
        super().__init__()
        shape = (packed.shape[0], packed.shape[1] * 2)
        self._hold(shape, packed=packed, scale_zero=scale_zero, bias=bias)

    @classmethod
    def from_groups(
        cls, g: GroupQuant, bias: torch.Tensor | None = None, dtype: torch.dtype = KERNEL_DTYPE
    ) -> "Int4Linear":
        """Pack decoded GGUF codes for the kernel (bias copied, kept in float32)."""
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(g.q.to(torch.int32), 1)
        scale, zero = g.kernel_scale_zero()  # [N, G] each
        scale_zero = torch.stack([scale.t(), zero.t()], dim=-1)  # [G, N, 2]
        return cls(packed, scale_zero.to(dtype).contiguous(), _bias_copy(bias))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features).to(self.scale_zero.dtype).contiguous()  # [M, K]
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x2, self.packed, GROUP, self.scale_zero)
        y = y.to(x.dtype)  # [M, N]
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)

    def dequantized(self) -> torch.Tensor:
        """The float32 weight ``[N, K]`` this layer computes with (for tests)."""
        eye = torch.eye(self.in_features, dtype=self.scale_zero.dtype)  # [K, K]
        w_t = torch.ops.aten._weight_int4pack_mm_for_cpu(eye, self.packed, GROUP, self.scale_zero)
        return w_t.float().t()  # [N, K]


class Int8Linear(QuantizedLinear):
    """Per-output-channel symmetric int8 re-quantization of a dense weight."""

    BUFFERS = ("q", "scale")
    q: torch.Tensor  # [N, K] int8
    scale: torch.Tensor  # [N] in the kernel dtype
    bias: torch.Tensor | None  # [N]

    FORMAT = "int8"

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        self._hold((q.shape[0], q.shape[1]), q=q, scale=scale, bias=bias)

    @classmethod
    def from_weight(
        cls,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        dtype: torch.dtype = KERNEL_DTYPE,
    ) -> "Int8Linear":
        """Quantize a dense weight ``[N, K]`` per output channel."""
        w = weight.detach().float()  # [N, K]
        amax = torch.maximum(w.amax(dim=1), -w.amin(dim=1))  # [N]
        scale = (amax.clamp_min(torch.finfo(torch.float32).tiny) / 127.0).to(dtype)  # [N]
        q = torch.div(w, scale.float()[:, None]).round_().clamp_(-127, 127)  # [N, K]
        # The scale is rounded to the kernel dtype before quantizing: the kernel uses it.
        return cls(q.to(torch.int8), scale, _bias_copy(bias))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features).to(self.scale.dtype).contiguous()  # [M, K]
        y = torch.ops.aten._weight_int8pack_mm(x2, self.q, self.scale).to(x.dtype)  # [M, N]
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)


def _float_bias(bias: torch.Tensor | None) -> torch.Tensor | None:
    return None if bias is None else bias.detach().to(torch.float32).contiguous().clone()


def unpack_codes(codes: torch.Tensor) -> torch.Tensor:
    """Our kernels' 4-bit layout ``[N, K / 2]`` -> codes ``[N, K / 32, 32]`` in input order."""
    halves = (codes & 0x0F, codes >> 4)  # [N, K/2] each
    return torch.cat([h.unflatten(-1, (-1, GROUP // 2)) for h in halves], dim=-1)


class NativeCall:
    """One native call for fixed layers sharing an input; its C structs are reused until a
    layer's arrays are replaced (then rebuilt), so a call costs little Python."""

    def __init__(self, layers: Sequence["NativeLinear"]) -> None:
        self.layers = list(layers)
        self.k = layers[0].in_features
        self.built: kernels.Layers | None = None

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        parts = [layer.part() for layer in self.layers]
        if self.built is None or not self.built.same(parts):
            self.built = kernels.Layers(self.k, parts)
        outs = self.built(x)
        return outs if x.dtype == torch.float32 else [y.to(x.dtype) for y in outs]


class NativeLinear(QuantizedLinear):
    """A quantized layer on our kernels; :meth:`part` names its form and arrays."""

    FORMAT: str  # a native format of engine.cpu.formats

    def part(self) -> kernels.PartSpec:
        buffers = self._buffers  # straight from the registry: this runs every call
        arrays = tuple(cast(torch.Tensor, buffers[name]) for name in self.BUFFERS)
        return self.FORMAT, arrays, buffers.get("bias")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        call = self.__dict__.get("_call")  # kept out of the module's registries
        if call is None:
            call = self.__dict__["_call"] = NativeCall([self])
        return call(x)[0]


class Q4Linear(NativeLinear):
    """4-bit GGUF codes with float16 scale and offset per group of 32, on our kernel."""

    FORMAT = "q4"
    BUFFERS = ("codes", "scale", "offset")
    codes: torch.Tensor  # [N, K / 2] uint8: byte j of a group = element j | element 16 + j << 4
    scale: torch.Tensor  # [N, K / 32] float16
    offset: torch.Tensor  # [N, K / 32] float16
    bias: torch.Tensor | None  # [N] float32

    def __init__(self, codes: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor,
                 bias: torch.Tensor | None = None) -> None:
        super().__init__()
        shape = (codes.shape[0], codes.shape[1] * 2)
        self._hold(shape, codes=codes, scale=scale, offset=offset, bias=bias)

    @classmethod
    def from_groups(cls, g: GroupQuant, bias: torch.Tensor | None = None) -> "Q4Linear":
        """Pack decoded GGUF codes in the kernel's layout (bias kept in float32)."""
        q = g.q.to(torch.uint8).unflatten(-1, (-1, GROUP))  # [N, G, 32]
        codes = (q[..., : GROUP // 2] | (q[..., GROUP // 2 :] << 4)).flatten(1)  # [N, K/2]
        return cls(codes.contiguous(), g.scale.half().contiguous(), g.offset.half().contiguous(),
                   _float_bias(bias))

    @classmethod
    def from_dense(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> "Q4Linear":
        """Round a dense weight ``[N, K]`` to 4 bits per group of 32 (min/max affine).

        For draft models only: a draft's numerics change its acceptance, never the output.
        """
        w = weight.detach().float().unflatten(-1, (-1, GROUP))  # [N, G, 32]
        low, high = w.amin(-1), w.amax(-1)  # [N, G]
        scale, offset = ((high - low) / 15).half(), low.half()  # what the kernel will use
        step = scale.float().unsqueeze(-1)
        q = torch.where(step > 0, (w - offset.float().unsqueeze(-1)) / step, 0.0)
        groups = GroupQuant(q.round().clamp(0, 15).to(torch.uint8).flatten(1),
                            scale.float(), offset.float())
        return cls.from_groups(groups, bias)

    def unpacked(self) -> torch.Tensor:
        """The codes ``[N, K / 32, 32]`` (uint8, 0..15) in input order."""
        return unpack_codes(self.codes)

    def dequantized(self) -> torch.Tensor:
        """The float32 weight ``[N, K]`` this layer holds (for tests)."""
        q = self.unpacked().float()  # [N, G, 32]
        w = q * self.scale.float().unsqueeze(-1) + self.offset.float().unsqueeze(-1)
        return w.flatten(1)


def kernel_order(t: torch.Tensor) -> torch.Tensor:
    """``t [..., K]`` with each super-block's 256 inputs in our kernels' order: vector j
    (32 bytes) holds inputs ``32 g + 4 j + r`` at ``4 g + r`` (see ``kernel_position`` in
    the C++ file). The order is its own inverse, so this also undoes it."""
    blocks = t.unflatten(-1, (-1, 8, 8, 4))  # [..., S, g, j, r]
    return blocks.transpose(-3, -2).flatten(-4)


def pack_pairs(q: torch.Tensor) -> torch.Tensor:
    """Codes ``[N, K]`` (0..15, input order) -> the q4k layout ``[N, K / 2]``: per 256
    inputs in kernel order (8 vectors of 32), byte j of chunk c holds vector 2c's element j
    in its low nibble and vector 2c + 1's in its high one."""
    vectors = kernel_order(q.to(torch.uint8)).unflatten(-1, (-1, 2, GROUP))  # [N, K/64, 2, 32]
    return (vectors[..., 0, :] | (vectors[..., 1, :] << 4)).flatten(1)


def unpack_pairs(codes: torch.Tensor) -> torch.Tensor:
    """The q4k layout ``[N, K / 2]`` -> codes ``[N, K / 32, 32]`` in input order."""
    chunks = codes.unflatten(-1, (-1, GROUP))  # [N, K/64, 32]
    vectors = torch.stack([chunks & 0x0F, chunks >> 4], dim=2).flatten(1)  # [N, K] kernel order
    return kernel_order(vectors).unflatten(-1, (-1, GROUP))


Q4K_RECORD = 40  # bytes of factors per pair of super-blocks (pack_factors)


def pack_factors(sc: torch.Tensor, mn: torch.Tensor, d: torch.Tensor, dmin: torch.Tensor
                 ) -> torch.Tensor:
    """Q4_K's factors -> the q4k records ``[N, ceil(S / 2) * 40]`` (uint8): per pair of
    super-blocks the 8 ``sc`` of both, the 8 ``mn`` of both, then ``d`` of both and
    ``dmin`` of both as float16 (little-endian); a lone last super-block's partner zero.
    ``sc``, ``mn`` ``[N, S * 8]`` (0..63), ``d``, ``dmin`` ``[N, S]`` (float16 values)."""
    n, s = d.shape
    half = d.to(torch.float16)
    if not (torch.equal(half.float(), d.float()) and torch.equal(dmin.to(torch.float16).float(),
                                                                  dmin.float())):
        raise ValueError("Q4_K's d and dmin must be float16 values")
    pairs = (s + 1) // 2
    pad = 2 * pairs - s

    def paired(t: torch.Tensor, width: int) -> torch.Tensor:  # [N, pairs, 2 * width] bytes
        t = torch.nn.functional.pad(t.reshape(n, s, width), (0, 0, 0, pad))
        return t.reshape(n, pairs, 2 * width)

    def halves(t: torch.Tensor) -> torch.Tensor:
        return t.to(torch.float16).contiguous().view(torch.uint8).reshape(n, s, 2)

    records = torch.cat([paired(sc.to(torch.uint8), 8), paired(mn.to(torch.uint8), 8),
                         paired(halves(d), 2), paired(halves(dmin), 2)], dim=-1)
    return records.reshape(n, pairs * Q4K_RECORD).contiguous()


def unpack_factors(meta: torch.Tensor, supers: int
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The records of :func:`pack_factors` -> ``sc``, ``mn`` (uint8 ``[N, S * 8]``) and
    ``d``, ``dmin`` (float32 ``[N, S]``) of ``supers`` super-blocks."""
    n = meta.shape[0]
    r = meta.reshape(n, -1, Q4K_RECORD)  # [N, pairs, 40]

    def unpaired(t: torch.Tensor, width: int) -> torch.Tensor:
        return t.reshape(n, -1, width)[:, :supers].reshape(n, -1)

    def floats(t: torch.Tensor) -> torch.Tensor:
        return unpaired(t, 2).contiguous().view(torch.float16).float()

    return (unpaired(r[..., :16], 8), unpaired(r[..., 16:32], 8), floats(r[..., 32:36]),
            floats(r[..., 36:40]))


class Q4KLinear(NativeLinear):
    """A Q4_K tensor in its own integer form (exactly the GGUF's weights), on our kernel."""

    FORMAT = "q4k"
    BUFFERS = ("codes", "meta")
    codes: torch.Tensor  # [N, K / 2] uint8, kernel order (pack_pairs)
    meta: torch.Tensor  # [N, ceil(K / 512) * 40] uint8: sc, mn, d, dmin (pack_factors)
    bias: torch.Tensor | None  # [N] float32

    def __init__(self, codes: torch.Tensor, meta: torch.Tensor,
                 bias: torch.Tensor | None = None) -> None:
        super().__init__()
        shape = (codes.shape[0], codes.shape[1] * 2)
        self._hold(shape, codes=codes, meta=meta, bias=bias)

    @classmethod
    def from_parts(cls, codes: torch.Tensor, sc: torch.Tensor, mn: torch.Tensor,
                   d: torch.Tensor, dmin: torch.Tensor, bias: torch.Tensor | None = None
                   ) -> "Q4KLinear":
        """From packed codes (:func:`pack_pairs`) and the factors of :func:`pack_factors`."""
        return cls(codes.contiguous(), pack_factors(sc, mn, d, dmin), _float_bias(bias))

    @classmethod
    def from_groups(cls, g: GroupQuant, bias: torch.Tensor | None = None) -> "Q4KLinear":
        """From a decoded Q4_K tensor (one with ``g.superblocks``)."""
        if g.superblocks is None:
            raise ValueError("Q4KLinear needs a Q4_K tensor's super-block factors")
        b = g.superblocks
        return cls.from_parts(pack_pairs(g.q), b.sc, b.mn, b.d, b.dmin, bias)

    def factors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``sc``, ``mn`` ``[N, K / 32]`` (uint8) and ``d``, ``dmin`` ``[N, K / 256]``
        (float32), as :func:`unpack_factors` reads them from the records."""
        return unpack_factors(self.meta, self.in_features // 256)

    def unpacked(self) -> torch.Tensor:
        """The codes ``[N, K / 32, 32]`` (uint8, 0..15) in input order."""
        return unpack_pairs(self.codes)

    def dequantized(self) -> torch.Tensor:
        """The float32 weight ``[N, K]``, computed as gguf-py does (for tests)."""
        sc, mn, d, dmin = self.factors()
        groups = sc.shape[1] // d.shape[1]  # 8 groups of 32 per super-block
        d, dmin = d.repeat_interleave(groups, dim=1), dmin.repeat_interleave(groups, dim=1)
        scale, offset = d * sc.float(), -(dmin * mn.float())  # [N, G]
        q = self.unpacked().float()  # [N, G, 32]
        return (q * scale.unsqueeze(-1) + offset.unsqueeze(-1)).flatten(1)


class Q6KLinear(NativeLinear):
    """A Q6_K tensor in its own integer form (exactly the GGUF's weights), on our kernel."""

    FORMAT = "q6k"
    BUFFERS = ("q", "sc", "d")
    q: torch.Tensor  # [N, K] int8, -32..31, kernel order (a byte each: cheaper to run than 6 bits)
    sc: torch.Tensor  # [N, K / 16] int8
    d: torch.Tensor  # [N, K / 256] float32
    bias: torch.Tensor | None  # [N] float32

    def __init__(self, q: torch.Tensor, sc: torch.Tensor, d: torch.Tensor,
                 bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self._hold((q.shape[0], q.shape[1]), q=q, sc=sc, d=d, bias=bias)

    @classmethod
    def from_blocks(cls, b: Q6Blocks, bias: torch.Tensor | None = None) -> "Q6KLinear":
        return cls(kernel_order(b.q).contiguous(), b.sc.contiguous(), b.d.float().contiguous(),
                   _float_bias(bias))

    def dequantized(self) -> torch.Tensor:
        """The float32 weight ``[N, K]``, computed as gguf-py does (for tests)."""
        return Q6Blocks(kernel_order(self.q), self.sc, self.d).dequantize()


Q6P_ORDER = (0, 2, 1, 3, 4, 6, 5, 7)  # the kernel-order vector in each 32 bytes of a packed block


def pack_q6(q: torch.Tensor) -> torch.Tensor:
    """Q6_K codes ``[N, K]`` (-32..31, kernel order) -> the q6kp layout ``[N, K * 3 / 4]``
    (uint8): per super-block ``u = code + 32`` with its vectors in :data:`Q6P_ORDER`,
    128 bytes of low nibbles (byte j: ``u[j]`` low, ``u[j + 128]`` high) and 64 of top bit
    pairs (byte j: those of ``u[j]``, ``u[j + 64]``, ``u[j + 128]``, ``u[j + 192]``)."""
    blocks = q.unflatten(-1, (-1, 8, GROUP))[..., Q6P_ORDER, :].flatten(-2)  # [N, S, 256]
    u = (blocks.to(torch.int16) + 32).to(torch.uint8)
    low = (u[..., :128] & 0x0F) | ((u[..., 128:] & 0x0F) << 4)  # [N, S, 128]
    top = u >> 4  # [N, S, 256], 0..3
    high = (top[..., :64] | (top[..., 64:128] << 2) | (top[..., 128:192] << 4)
            | (top[..., 192:] << 6))  # [N, S, 64]
    return torch.cat([low, high], dim=-1).flatten(1)


def unpack_q6(packed: torch.Tensor) -> torch.Tensor:
    """The q6kp layout ``[N, K * 3 / 4]`` -> codes ``[N, K]`` (int8, kernel order)."""
    blocks = packed.unflatten(-1, (-1, 192))  # [N, S, 192]
    low, high = blocks[..., :128], blocks[..., 128:]
    nibbles = torch.cat([low & 0x0F, low >> 4], dim=-1)  # [N, S, 256]
    tops = torch.cat([(high >> s) & 0x03 for s in (0, 2, 4, 6)], dim=-1)  # [N, S, 256]
    u = (nibbles | (tops << 4)).to(torch.int8) - 32  # Q6P_ORDER
    inverse = [Q6P_ORDER.index(v) for v in range(8)]
    return u.unflatten(-1, (8, GROUP))[..., inverse, :].flatten(1)


Q6P_BLOCK = 210  # bytes per super-block of a q6kp layer: 192 of codes, 16 scales, d


def q6p_blocks(q: torch.Tensor, sc: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """A Q6_K tensor's codes ``[N, K]`` (kernel order), scales ``[N, K / 16]`` (int8) and
    ``d`` ``[N, K / 256]`` (float16 values) -> the q6kp layout ``[N, K / 256 * 210]``
    (uint8): per super-block its codes as :func:`pack_q6` packs them, its 16 scales, and
    its ``d`` as float16 (little-endian)."""
    n, s = d.shape
    half = d.to(torch.float16)
    if not torch.equal(half.float(), d.float()):
        raise ValueError("Q6_K's d must be float16 values")
    codes = pack_q6(q).reshape(n, s, 192)
    scales = sc.contiguous().view(torch.uint8).reshape(n, s, 16)
    ds = half.contiguous().view(torch.uint8).reshape(n, s, 2)
    return torch.cat([codes, scales, ds], dim=-1).reshape(n, s * Q6P_BLOCK).contiguous()


def split_q6p(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The q6kp layout -> codes ``[N, K]`` (int8, kernel order), scales ``[N, K / 16]``
    (int8) and ``d`` ``[N, K / 256]`` (float32): what :func:`q6p_blocks` took."""
    n = blocks.shape[0]
    b = blocks.reshape(n, -1, Q6P_BLOCK)  # [N, S, 210]
    q = unpack_q6(b[..., :192].reshape(n, -1))
    sc = b[..., 192:208].contiguous().view(torch.int8).reshape(n, -1)
    d = b[..., 208:].contiguous().view(torch.float16).reshape(n, -1).float()
    return q, sc, d


class Q6KPLinear(NativeLinear):
    """A Q6_K tensor in its own integer form with its codes in 6 bits: the weights and the
    outputs of :class:`Q6KLinear`, bit for bit, from the GGUF's 210 bytes a super-block
    (276 in :class:`Q6KLinear`), in one array."""

    FORMAT = "q6kp"
    BUFFERS = ("blocks",)
    blocks: torch.Tensor  # [N, K / 256 * 210] uint8 (q6p_blocks)
    bias: torch.Tensor | None  # [N] float32

    def __init__(self, blocks: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self._hold((blocks.shape[0], blocks.shape[1] // Q6P_BLOCK * 256), blocks=blocks, bias=bias)

    @classmethod
    def from_blocks(cls, b: Q6Blocks, bias: torch.Tensor | None = None) -> "Q6KPLinear":
        return cls(q6p_blocks(kernel_order(b.q), b.sc, b.d), _float_bias(bias))

    def parts(self) -> Q6Blocks:
        """The codes (input order), scales and ``d`` the blocks hold."""
        q, sc, d = split_q6p(self.blocks)
        return Q6Blocks(kernel_order(q), sc, d)

    def dequantized(self) -> torch.Tensor:
        """The float32 weight ``[N, K]``, computed as gguf-py does (for tests)."""
        return self.parts().dequantize()


class Q8Linear(NativeLinear):
    """Per-output-channel int8 codes with a float32 scale, on our kernel."""

    FORMAT = "q8"
    BUFFERS = ("q", "scale")
    q: torch.Tensor  # [N, K] int8
    scale: torch.Tensor  # [N] float32
    bias: torch.Tensor | None  # [N] float32

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        self._hold((q.shape[0], q.shape[1]), q=q, scale=scale, bias=bias)

    @classmethod
    def from_weight(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> "Q8Linear":
        """Quantize a dense weight ``[N, K]`` per output channel (as :class:`Int8Linear`)."""
        ref = Int8Linear.from_weight(weight)
        return cls(ref.q, ref.scale.float(), _float_bias(bias))


BY_FORMAT: dict[str, type[QuantizedLinear]] = {
    cls.FORMAT: cls for cls in (Int4Linear, Int8Linear, Q4Linear, Q4KLinear, Q6KLinear,
                                Q6KPLinear, Q8Linear)
}  # the quantized layer class of each format (engine.cpu.formats)


def select_rows(layer: nn.Module, rows: slice | torch.Tensor) -> nn.Module | None:
    """The output features ``rows`` of ``layer`` as a layer of the same kind, or None.

    A slice shares the layer's memory; an index tensor copies those rows."""
    if isinstance(layer, nn.Linear):
        weight = layer.weight[rows].detach()  # [n, K]
        out = nn.Linear(layer.in_features, int(weight.shape[0]), bias=layer.bias is not None,
                        device="meta")
        out.weight = nn.Parameter(weight.contiguous(), requires_grad=False)
        if layer.bias is not None:
            out.bias = nn.Parameter(layer.bias[rows].detach(), requires_grad=False)
        return out
    if isinstance(layer, QuantizedLinear) and formats.format_of(layer).row_major:
        buffers = [getattr(layer, name)[rows] for name in layer.BUFFERS]
        bias = getattr(layer, "bias", None)
        return cast(Any, type(layer))(*buffers, bias=None if bias is None else bias[rows])
    return None


def as_int4(layer: Any) -> Any:
    """``layer`` re-rounded to 4 bits per 32 inputs on our kernels (:meth:`Q4Linear.from_dense`,
    about two thirds of Q6_K's bytes), or ``layer`` itself where the kernels cannot run it
    or its weight cannot be read. For drafting only: it changes which tokens are drafted,
    never which are accepted."""
    if isinstance(layer, Q4Linear) or not native_fits(int(layer.in_features)):
        return layer
    if isinstance(layer, nn.Linear) and layer.weight.dtype == torch.float32:
        weight = layer.weight.detach()
    elif isinstance(layer, (Q4KLinear, Q6KLinear, Q6KPLinear)):
        weight = layer.dequantized()  # [N, K]
    else:
        return layer
    return Q4Linear.from_dense(weight, getattr(layer, "bias", None))


def native_fits(in_features: int) -> bool:
    """Whether our kernels can run a layer with this many inputs here."""
    return in_features % GROUP == 0 and kernels.available()
