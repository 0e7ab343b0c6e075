"""The one Llama/Qwen2 forward pass the engine runs, with the KV cache it owns.

Contract: :func:`forward_for` turns a loaded Llama or Qwen2 causal LM (full attention,
SiLU MLP, no tensor-parallel slicing) into a :class:`Forward`; any other model raises
:class:`UnsupportedModelError` with the reason. transformers only loads the weights and the
tokenizer: embedding, RMSNorm, rotary positions, attention, the MLP, the residual adds
and the cache are computed here, over the model's own modules' weights (its linear
layers called as modules: ours from :mod:`engine.cpu.layers`, or ``nn.Linear``).

``Forward.step(ids, cache, rows, keep, parents)`` appends ``ids`` to ``cache`` (a
:class:`KVCache`) and returns the logits of the last ``rows`` new positions ``[rows, V]``
and, with ``keep``, the final normed hidden states of all of them ``[T, H]`` (the
features an EAGLE head drafts from). With ``taps`` (ascending layer indices, each below
the last layer) the kept features are wider: the residual stream after each of those
layers, then the final normed state, side by side ``[T, (len(taps) + 1) H]`` (the low,
middle and high features an EAGLE-3 head fuses); the native back end then runs the layers
in that many calls, one per stretch between taps. With ``parents`` (row ``i``'s parent row, ``-1``
for the first) the rows are a draft tree of at most :data:`TREE_ROWS`: each sits at the
position after its parent's and attends to the cache and its own ancestors.
:class:`Stack` is the same pass for a bare decoder stack fed vectors instead of ids (an
EAGLE head's layer): no embedding, no output layer.

Two back ends, chosen once at construction and named in :attr:`Forward.plan`:

* ``native``: every decoder layer of a step in one C call (``anve_decoder_step``,
  :mod:`engine.cpu.kernels`), where the kernels run, the model computes in float32 and
  every linear layer of the stack is on our kernels;
* ``reference``: the same computation in torch (each attention row its own ``sdpa``
  call over its causal prefix), for any linear layer class and dtype. It is the
  reference the tests hold the native back end to, and what machines without the
  kernels run.

The row promise: both back ends compute each position with operations that do not
depend on which other rows came in the same step, so where the linear layers are
row-independent (every quantized format, :mod:`engine.cpu.formats`) a k-row step gives
each row bit for bit what one-row steps give it. Verification then computes exactly what
decoding does (greedy speculative decoding emits plain decoding's tokens), and a prompt
read in chunks of any size leaves the same cache. Native and reference differ within
float32 rounding (norm sums, ``exp``).
"""

import ctypes
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from itertools import pairwise
from typing import Any

import torch
import torch.nn.functional as F

from engine.cpu import formats, kernels
from engine.cpu.layers import NativeLinear

SUPPORTED = frozenset({"LlamaForCausalLM", "Qwen2ForCausalLM"})
TREE_ROWS = 16  # rows of one verification step (a chain or a draft tree)
READ_ROWS = 64  # positions per native call while reading a prompt
MIN_CAPACITY = 256  # positions a layer's cache allocates at first use
# an output layer a call may use in place of the model's: normed states [rows, H] -> logits
Head = Callable[[torch.Tensor], torch.Tensor]

ROLES = ("q", "k", "v", "o", "gate", "up", "down")


class UnsupportedModelError(ValueError):
    """A model this forward pass does not compute (another architecture or feature)."""


class LayerCache:
    """One layer's keys and values, ``[Hkv, capacity, Dh]`` buffers with spare room.

    The first :attr:`length` positions are valid; capacity doubles when full, so a step
    writes its new positions instead of copying the cache.
    """

    def __init__(self) -> None:
        self.key_buf: torch.Tensor | None = None
        self.value_buf: torch.Tensor | None = None
        self.length = 0

    def room(self, new: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        """Make room for ``new`` more positions; returns the first of them."""
        needed = self.length + new
        capacity = 0 if self.key_buf is None else self.key_buf.shape[1]
        if needed > capacity:
            size = max(needed, 2 * capacity, MIN_CAPACITY)
            keys = torch.empty(kv_heads, size, head_dim, dtype=dtype)
            values = torch.empty(kv_heads, size, head_dim, dtype=dtype)
            if self.length and self.key_buf is not None and self.value_buf is not None:
                keys[:, : self.length] = self.key_buf[:, : self.length]
                values[:, : self.length] = self.value_buf[:, : self.length]
            self.key_buf, self.value_buf = keys, values
        return self.length

    def write(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Append ``keys``, ``values`` ``[Hkv, T, Dh]`` after the valid positions."""
        start = self.room(keys.shape[1], keys.shape[0], keys.shape[2], keys.dtype)
        assert self.key_buf is not None and self.value_buf is not None
        self.key_buf[:, start : start + keys.shape[1]] = keys
        self.value_buf[:, start : start + keys.shape[1]] = values
        self.length = start + keys.shape[1]

    @property
    def keys(self) -> torch.Tensor:
        """The valid keys ``[Hkv, length, Dh]`` (a view)."""
        assert self.key_buf is not None
        return self.key_buf[:, : self.length]

    @property
    def values(self) -> torch.Tensor:
        assert self.value_buf is not None
        return self.value_buf[:, : self.length]

    def keep(self, start: int, rows: Sequence[int]) -> None:
        """Of the positions from ``start`` on keep ``rows`` (ascending offsets), moved
        down to follow ``start - 1``: a draft tree's accepted path."""
        if any(b <= a for a, b in pairwise(rows)) or (
                rows and (rows[0] < 0 or start + rows[-1] >= self.length)):
            raise ValueError(f"rows must ascend within the {self.length - start} from {start}")
        if self.key_buf is not None and self.value_buf is not None and rows:
            picked = torch.tensor(list(rows), dtype=torch.long) + start
            for buf in (self.key_buf, self.value_buf):
                buf[:, start : start + len(rows)] = buf.index_select(1, picked)
        self.length = start + len(rows)

    def copy(self, length: int) -> "LayerCache":
        """A new layer cache holding a copy of the first ``length`` positions."""
        out = LayerCache()
        if length and self.key_buf is not None:
            out.write(self.keys[:, :length], self.values[:, :length])
        return out


class KVCache:
    """The keys and values of every layer of one sequence; all layers hold as many."""

    def __init__(self, layers: int) -> None:
        self.layers = [LayerCache() for _ in range(layers)]

    def __len__(self) -> int:
        return self.layers[0].length if self.layers else 0

    def crop(self, length: int) -> None:
        """Keep the first ``length`` positions (``length`` may not exceed what is held)."""
        if not 0 <= length <= len(self):
            raise ValueError(f"cannot crop a cache of {len(self)} positions to {length}")
        for layer in self.layers:
            layer.length = length

    def keep(self, start: int, rows: Sequence[int]) -> None:
        """:meth:`LayerCache.keep` in every layer."""
        for layer in self.layers:
            layer.keep(start, rows)

    def prefix(self, length: int) -> "KVCache":
        """A new cache holding a copy of the first ``length`` positions."""
        if not 0 <= length <= len(self):
            raise ValueError(f"a cache of {len(self)} positions has no prefix of {length}")
        out = KVCache(0)
        out.layers = [layer.copy(length) for layer in self.layers]
        return out


@dataclass(frozen=True)
class _Layer:
    norm1: Any  # RMSNorm modules: their weight [H]
    norm2: Any
    q: Any
    k: Any
    v: Any
    o: Any
    gate: Any
    up: Any
    down: Any

    def linears(self) -> list[Any]:
        return [self.q, self.k, self.v, self.o, self.gate, self.up, self.down]


@dataclass(frozen=True)
class ForwardPlan:
    """How a model's forward runs, decided once when it is built (see the module).

    ``formats`` counts the decoder layers' linear layers by weight format
    (:mod:`engine.cpu.formats`); ``layers`` counts them per role (q, k, v, o, gate, up,
    down) and format; ``output`` is the output layer's format.
    """

    backend: str  # "native" or "reference"
    variant: str | None  # the kernel variant the native back end runs
    attention: str
    formats: dict[str, int]
    layers: dict[str, dict[str, int]]  # role -> format -> how many layers
    output: str  # the output layer's format
    dtype: str
    rows_per_pass: int  # rows one pass over the weights holds (native), else 0
    tree_rows: int = TREE_ROWS
    read_rows: int = READ_ROWS
    row_invariant: bool = False  # every linear layer row-independent
    why_reference: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        """One line for logs and the admin page."""
        kinds = ", ".join(f"{n} {name}" for name, n in sorted(self.formats.items()))
        where = f"{self.backend} ({self.variant})" if self.variant else self.backend
        tail = f"; reference because {self.why_reference}" if self.why_reference else ""
        return (f"{where}, {self.attention}, {self.dtype}; layers: {kinds}; output "
                f"{self.output}; {self.tree_rows} rows a verification, {self.read_rows} a "
                f"prompt read{tail}")


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama's RMSNorm of ``x [..., H]``: in float32, scaled back in the input's dtype."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


class _Decoder:
    """The decoder layers, rotary positions and final norm of one stack, and its back end."""

    def __init__(self, stack: Any, config: Any, dtype: torch.dtype) -> None:
        if getattr(config, "hidden_act", None) != "silu":
            raise UnsupportedModelError(f"the MLP activation is {config.hidden_act!r}, not SiLU")
        if getattr(config, "pretraining_tp", 1) != 1:
            raise UnsupportedModelError("tensor-parallel slicing (pretraining_tp) is not supported")
        attns = [d.self_attn for d in stack.layers]
        if any(getattr(a, "sliding_window", None) for a in attns):
            raise UnsupportedModelError("sliding-window attention is not supported")
        self.dtype = dtype
        self.layers = [
            _Layer(d.input_layernorm, d.post_attention_layernorm, d.self_attn.q_proj,
                   d.self_attn.k_proj, d.self_attn.v_proj, d.self_attn.o_proj,
                   d.mlp.gate_proj, d.mlp.up_proj, d.mlp.down_proj)
            for d in stack.layers]
        self.norm = stack.norm
        self.eps = float(stack.norm.variance_epsilon)
        epsilons = {float(n.variance_epsilon) for d in stack.layers
                    for n in (d.input_layernorm, d.post_attention_layernorm)}
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(getattr(config, "num_key_value_heads", None) or self.heads)
        self.head_dim = int(attns[0].head_dim)
        self.scaling = float(attns[0].scaling)
        rotary = stack.rotary_emb
        self.inv_freq = rotary.inv_freq.detach().to(torch.float32)  # [Dh / 2]
        self.rope_scale = float(rotary.attention_scaling)
        self.native: kernels.DecoderModel | None = None
        self.why_reference = self._why_not_native(config, epsilons, attns)
        if self.why_reference is None:
            self._build_native(config)

    # --- the plan -------------------------------------------------------------------

    def _why_not_native(self, config: Any, epsilons: set[float], attns: list[Any]) -> str | None:
        if not kernels.available():
            return "the native kernels do not run here"
        if self.dtype != torch.float32:
            return f"the model computes in {str(self.dtype).removeprefix('torch.')}"
        if not all(isinstance(lin, NativeLinear) for layer in self.layers
                   for lin in layer.linears()):
            return "not every linear layer is on our kernels"
        norms = [n.weight for layer in self.layers for n in (layer.norm1, layer.norm2)]
        if not all(n.dtype == torch.float32 and n.is_contiguous() for n in norms):
            return "the norms' weights are not contiguous float32"
        if len(epsilons) != 1 or len({float(a.scaling) for a in attns}) != 1:
            return "the layers differ in norm epsilon or attention scaling"
        if self.head_dim % 8:
            return f"the head size {self.head_dim} is not a multiple of 8"
        return None

    def role_formats(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for layer in self.layers:
            for role, lin in zip(ROLES, layer.linears(), strict=True):
                name = formats.format_of(lin).name
                out.setdefault(role, {})[name] = out.get(role, {}).get(name, 0) + 1
        return out

    # --- native ---------------------------------------------------------------------

    def _build_native(self, config: Any) -> None:
        self._parts: dict[tuple[int, int], kernels.DecoderModel] = {}
        self.structs = (kernels.DecoderLayer * len(self.layers))()
        self.native = kernels.DecoderModel(
            len(self.layers), int(config.hidden_size), self.heads, self.kv_heads,
            self.head_dim, int(config.intermediate_size), self.eps, self.scaling,
            self.structs)
        self._bind()

    def _bind(self) -> None:
        """Point the C structs at the layers' current weight buffers (kept alive here)."""
        self._held: list[kernels.Layers] = []
        for struct, layer in zip(self.structs, self.layers, strict=True):
            struct.norm1 = layer.norm1.weight.data_ptr()
            struct.norm2 = layer.norm2.weight.data_ptr()
            qkv, o, gate_up, down = (
                kernels.Layers(group[0].in_features, [lin.part() for lin in group])
                for group in ([layer.q, layer.k, layer.v], [layer.o], [layer.gate, layer.up],
                              [layer.down]))
            self._held += [qkv, o, gate_up, down]
            struct.qkv[:] = list(qkv.structs)
            struct.gate_up[:] = list(gate_up.structs)
            struct.o, struct.down = o.structs[0], down.structs[0]
        watch = [(module._buffers, name, tensor) for layer in self.layers
                 for module in layer.linears() for name, tensor in module._buffers.items()]
        watch += [(norm._parameters, "weight", norm.weight) for layer in self.layers
                  for norm in (layer.norm1, layer.norm2)]
        # identities are safe to compare: _tensors keeps every watched tensor alive
        self._registries, self._names, self._tensors = zip(*watch, strict=True)
        self._ids = tuple(map(id, self._tensors))

    def _current(self) -> bool:
        """Whether every watched registry still holds the very tensor the structs point
        into (a layer whose buffers were replaced, e.g. moved into huge pages, rebinds);
        one C-level pass over the ~1,200 entries, not a Python loop, as it runs every step."""
        return tuple(map(id, map(dict.get, self._registries, self._names))) == self._ids

    # --- the pass -------------------------------------------------------------------

    def rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos``, ``sin`` ``[T, Dh]`` of ``positions [T]``, as Llama's rotary computes them."""
        freqs = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]  # [T, Dh / 2]
        emb = torch.cat((freqs, freqs), dim=-1)
        return ((emb.cos() * self.rope_scale).to(self.dtype),
                (emb.sin() * self.rope_scale).to(self.dtype))

    def check_taps(self, taps: Sequence[int]) -> None:
        """Raise ``ValueError`` unless ``taps`` are ascending layers before the last."""
        if any(not 0 <= t < len(self.layers) - 1 for t in taps) \
                or any(a >= b for a, b in pairwise(taps)):
            raise ValueError(f"feature layers {list(taps)} must ascend, each below the last "
                             f"of {len(self.layers)} layers")

    def run(self, x: torch.Tensor, cache: KVCache, depth: Sequence[int],
            tree: torch.Tensor | None, taps: Sequence[int] = ()) -> torch.Tensor:
        """``x [T, H]`` (new rows at positions ``len(cache) + depth``) through every layer,
        their keys and values appended to ``cache``; returns the final normed ``[T, H]``,
        after the residual streams of layers ``taps`` when there are any
        (``[T, (len(taps) + 1) H]``)."""
        if len(cache.layers) != len(self.layers):
            raise ValueError(f"a cache of {len(cache.layers)} layers for a model of "
                             f"{len(self.layers)}")
        self.check_taps(taps)
        start = len(cache)
        cos, sin = self.rotary(torch.tensor(list(depth)) + start)
        tapped: list[torch.Tensor] = []
        if self.native is not None:
            x = self._run_native(x, cache, start, cos, sin, tree, taps, tapped)
        else:
            x = self._run_reference(x, cache, start, cos, sin, tree, taps, tapped)
        return self._features(tapped, x)

    def _features(self, tapped: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """The final normed ``x``, after the tapped residual streams if any (no copy
        without taps: the decoding step's common case)."""
        normed = rms_norm(x, self.norm.weight, self.eps)
        return torch.cat([*tapped, normed], dim=-1) if tapped else normed

    def _segments(self, taps: Sequence[int]) -> list[tuple[int, int]]:
        """The stretches of layers ``[a, b)`` run between taps (one without taps)."""
        bounds = [0, *(t + 1 for t in taps), len(self.layers)]
        return list(pairwise(bounds))

    def _native_part(self, a: int, b: int) -> kernels.DecoderModel:
        """The native model of layers ``a .. b - 1`` (pointing into the same structs)."""
        assert self.native is not None
        if (a, b) == (0, len(self.layers)):
            return self.native
        part = self._parts.get((a, b))
        if part is None:
            first = ctypes.cast(ctypes.byref(self.structs, a * ctypes.sizeof(kernels.DecoderLayer)),
                                ctypes.POINTER(kernels.DecoderLayer))
            n = self.native
            part = kernels.DecoderModel(b - a, n.hidden, n.heads, n.kv_heads, n.head_dim,
                                        n.inter, n.eps, n.scaling, first)
            self._parts[(a, b)] = part
        return part

    def _run_native(self, x: torch.Tensor, cache: KVCache, start: int, cos: torch.Tensor,
                    sin: torch.Tensor, tree: torch.Tensor | None, taps: Sequence[int],
                    tapped: list[torch.Tensor]) -> torch.Tensor:
        assert self.native is not None
        if not self._current():
            self._bind()
        t = x.shape[0]
        for struct, layer in zip(self.structs, cache.layers, strict=True):
            layer.room(t, self.kv_heads, self.head_dim, torch.float32)
            assert layer.key_buf is not None and layer.value_buf is not None
            struct.kbuf, struct.vbuf = layer.key_buf.data_ptr(), layer.value_buf.data_ptr()
            struct.head_stride = layer.key_buf.stride(0)
        x = x.to(torch.float32).contiguous().clone()[None]  # [1, T, H], updated in place
        cos, sin = cos.contiguous(), sin.contiguous()
        for a, b in self._segments(taps):
            kernels.decoder_step(self._native_part(a, b), x, start, cos, sin, tree)
            if b < len(self.layers):
                tapped.append(x[0].clone())  # [T, H] after layer b - 1
        for layer in cache.layers:
            layer.length = start + t
        return x[0]

    def run_seqs(self, x: torch.Tensor, caches: Sequence[KVCache], seq: Sequence[int],
                 pos: Sequence[int], taps: Sequence[int] = ()) -> torch.Tensor:
        """Rows of several sequences in one native call (see :meth:`Forward.step_many`):
        ``x [T, H]``, row ``t`` at position ``pos[t]`` of ``caches[seq[t]]``; returns the
        final normed ``[T, H]`` (after the tapped residual streams, as :meth:`run`)."""
        assert self.native is not None
        self.check_taps(taps)
        if not self._current():
            self._bind()
        cos, sin = self.rotary(torch.tensor(list(pos)))
        counts = [0] * len(caches)
        for s in seq:
            counts[s] += 1
        keys, values, strides = [], [], []
        for cache, count in zip(caches, counts, strict=True):
            for layer in cache.layers:
                layer.room(count, self.kv_heads, self.head_dim, torch.float32)
                assert layer.key_buf is not None and layer.value_buf is not None
                keys.append(layer.key_buf.data_ptr())
                values.append(layer.value_buf.data_ptr())
                strides.append(layer.key_buf.stride(0))
        x = x.to(torch.float32).contiguous().clone()  # [T, H], updated in place
        seqs, poss = (torch.tensor(list(a), dtype=torch.int32) for a in (seq, pos))
        cos, sin = cos.contiguous(), sin.contiguous()
        per_seq = [torch.tensor(a, dtype=torch.int64).view(len(caches), -1)  # [S, layers]
                   for a in (keys, values, strides)]
        tapped = []
        for a, b in self._segments(taps):
            k, v, st = (t[:, a:b].contiguous().view(-1) for t in per_seq)
            kernels.decoder_step_seqs(self._native_part(a, b), x, seqs, poss, cos, sin, k, v, st)
            if b < len(self.layers):
                tapped.append(x.clone())  # [T, H] after layer b - 1
        for cache, count in zip(caches, counts, strict=True):
            for layer in cache.layers:
                layer.length += count
        return self._features(tapped, x)

    def _run_reference(self, x: torch.Tensor, cache: KVCache, start: int, cos: torch.Tensor,
                       sin: torch.Tensor, tree: torch.Tensor | None, taps: Sequence[int],
                       tapped: list[torch.Tensor]) -> torch.Tensor:
        t, dh = x.shape[0], self.head_dim
        c, s = cos[:, None], sin[:, None]  # [T, 1, Dh]
        for i, (layer, kv) in enumerate(zip(self.layers, cache.layers, strict=True)):
            h = rms_norm(x, layer.norm1.weight, self.eps)
            q = layer.q(h).view(t, self.heads, dh)
            k = layer.k(h).view(t, self.kv_heads, dh)
            v = layer.v(h).view(t, self.kv_heads, dh)
            q, k = q * c + _rotate_half(q) * s, k * c + _rotate_half(k) * s
            kv.write(k.transpose(0, 1), v.transpose(0, 1))  # [Hkv, T, Dh] each
            out = self._attend(q, kv.keys, kv.values, start, tree)  # [T, H * Dh]
            x = x + layer.o(out)
            h = rms_norm(x, layer.norm2.weight, self.eps)
            x = x + layer.down(F.silu(layer.gate(h)) * layer.up(h))
            if i in taps:
                tapped.append(x)  # [T, H] after layer i
        return x

    def _attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                before: int, tree: torch.Tensor | None) -> torch.Tensor:
        """Each row of ``q [T, H, Dh]`` over its own causal prefix of ``keys``,
        ``values [Hkv, L, Dh]`` (or, in a tree, the cache before the rows and the rows its
        mask names), one ``sdpa`` call per row: ``[T, H * Dh]``."""
        t = q.shape[0]
        rows = []
        for i in range(t):
            if tree is None:
                k, v = keys[:, : before + i + 1], values[:, : before + i + 1]
            else:
                seen = [before + j for j in range(t) if int(tree[i]) >> j & 1]
                k = torch.cat([keys[:, :before], keys[:, seen]], dim=1)
                v = torch.cat([values[:, :before], values[:, seen]], dim=1)
            out = F.scaled_dot_product_attention(q[i][:, None], k, v, scale=self.scaling,
                                                 enable_gqa=True)  # [H, 1, Dh]
            rows.append(out.reshape(1, -1))  # [1, H * Dh]
        return torch.cat(rows)


def _tree(parents: Sequence[int] | None, t: int) -> tuple[torch.Tensor | None, list[int]]:
    """Tree masks and each row's depth (its position after the cache)."""
    if parents is None:
        return None, list(range(t))
    if len(parents) != t or not 0 < t <= TREE_ROWS or parents[0] != -1 \
            or any(not 0 <= p < i for i, p in enumerate(parents) if i):
        raise ValueError(f"bad draft tree: {t} ids, parents {list(parents)}")
    return kernels.tree_masks(parents), kernels.tree_depths(parents)


class Forward:
    """The forward pass of one causal LM over its :class:`KVCache` (see the module)."""

    def __init__(self, model: Any, lm_head: Any = None) -> None:
        name = type(model).__name__
        if name not in SUPPORTED:
            raise UnsupportedModelError(f"ANVE computes Llama and Qwen2 models "
                                        f"({', '.join(sorted(SUPPORTED))}), not {name}")
        self.embed = model.model.embed_tokens.weight.detach()  # [V, H]
        self.lm_head = model.lm_head if lm_head is None else lm_head
        self.dtype = self.embed.dtype
        self.decoder = _Decoder(model.model, model.config, self.dtype)
        self.plan = make_plan(self.decoder, self.lm_head)

    def new_cache(self) -> KVCache:
        return KVCache(len(self.decoder.layers))

    @torch.inference_mode()
    def step(self, ids: Sequence[int], cache: KVCache, rows: int, keep: bool,
             parents: Sequence[int] | None = None, taps: Sequence[int] = (),
             head: Head | None = None,
             ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits ``[rows, V]`` of the last ``rows`` new positions and, with ``keep``, the
        final normed hidden states ``[T, H]`` (after the residual streams of layers
        ``taps``: ``[T, (len(taps) + 1) H]``); ``rows=0`` skips the output layer (the logits
        are then ``[0, 0]``). ``parents``: a draft tree (see the module). ``head`` maps the
        normed states ``[rows, H]`` to the logits in place of the output layer (a drafter's
        kept ids only, ``[rows, N]``)."""
        if not ids:
            raise ValueError("a step needs at least one token")
        tree, depth = _tree(parents, len(ids))
        x = self.embed[torch.tensor(list(ids), dtype=torch.long)]  # [T, H]
        size = x.shape[-1]
        x = self.decoder.run(x, cache, depth, tree, taps if keep else ())  # [T, F]
        out = x[:, -size:]  # [T, H] the final normed state
        output = self.lm_head if head is None else head
        logits = output(out[len(ids) - rows :]) if rows else x[:0, :0]  # [rows, V]
        return logits, (x if keep else None)

    def read(self, ids: Sequence[int], cache: KVCache, rows: int, keep: bool,
             taps: Sequence[int] = (),
             head: Head | None = None,
             ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:meth:`step` over any number of ids, in steps of at most :data:`READ_ROWS`
        (the row promise makes the result independent of the split)."""
        logits, features = [], []
        for start in range(0, len(ids), READ_ROWS):
            chunk = ids[start : start + READ_ROWS]
            after = len(ids) - start - len(chunk)  # positions after this chunk
            wanted = max(0, min(len(chunk), rows - after))
            out, hidden = self.step(chunk, cache, wanted, keep, taps=taps, head=head)
            if wanted:
                logits.append(out)
            if hidden is not None:
                features.append(hidden)
        vocab = logits[0].shape[-1] if logits else 0
        return (torch.cat(logits) if logits else torch.empty(0, vocab),
                torch.cat(features) if keep else None)

    @torch.inference_mode()
    def step_many(self, steps: Sequence[tuple[Sequence[int], KVCache]],
                  rows: Sequence[int] | None = None, keep: bool = False,
                  taps: Sequence[int] = ()) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """New ids of several sequences in one pass (batched decoding): ``steps[b]`` is
        ``(ids, cache)``, the ids appended to that sequence's own cache; returns for each
        what :meth:`step` returns: the logits of its last ``rows[b]`` new positions
        (default 1) ``[rows_b, V]`` and, with ``keep``, its final normed hidden states
        ``[T_b, H]``. The native back end runs every row in one call, reading the weights
        once for all, and gives each row bit for bit what stepping its sequence alone
        gives (the row promise across sequences); the reference steps each sequence on
        its own. ``taps`` as for :meth:`step`."""
        rows = [1] * len(steps) if rows is None else list(rows)
        if not steps or len(rows) != len(steps):
            raise ValueError(f"{len(steps)} sequences and {len(rows)} row counts")
        if len({id(cache) for _, cache in steps}) != len(steps):
            raise ValueError("each sequence of a batched step needs a cache of its own")
        if any(not ids or not 0 <= r <= len(ids) for (ids, _), r in zip(steps, rows, strict=True)):
            raise ValueError("every sequence needs at least one id and at most that many rows")
        if self.decoder.native is None:
            return [self.step(ids, cache, r, keep, taps=taps)
                    for (ids, cache), r in zip(steps, rows, strict=True)]
        flat = [int(t) for ids, _ in steps for t in ids]
        seq = [b for b, (ids, _) in enumerate(steps) for _ in ids]
        pos = [len(cache) + i for ids, cache in steps for i in range(len(ids))]
        x = self.embed[torch.tensor(flat, dtype=torch.long)]  # [T, H]
        size = x.shape[-1]
        x = self.decoder.run_seqs(x, [cache for _, cache in steps], seq, pos,
                                  taps if keep else ())  # [T, F]
        ends = torch.tensor([len(ids) for ids, _ in steps]).cumsum(0).tolist()
        picked = [i for end, r in zip(ends, rows, strict=True) for i in range(end - r, end)]
        logits = self.lm_head(x[picked, -size:]) if picked else x[:0, :0]  # [sum(rows), V]
        hidden = x.split([len(ids) for ids, _ in steps]) if keep else [None] * len(steps)
        return list(zip(logits.split(rows), hidden, strict=True))


class Stack:
    """A bare decoder stack fed input vectors (an EAGLE head's ``LlamaModel``): the
    pass of :class:`Forward` without embedding and output layer."""

    def __init__(self, stack: Any, dtype: torch.dtype = torch.float32) -> None:
        self.decoder = _Decoder(stack, stack.config, dtype)
        self.plan = make_plan(self.decoder, None)

    def new_cache(self) -> KVCache:
        return KVCache(len(self.decoder.layers))

    @torch.inference_mode()
    def __call__(self, x: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """``x [T, H]`` after the cached positions -> normed ``[T, H]``; the cache grows."""
        return self.decoder.run(x.to(self.decoder.dtype), cache, range(x.shape[0]), None)


def make_plan(decoder: _Decoder, lm_head: Any) -> ForwardPlan:
    """The :class:`ForwardPlan` of a decoder (and its output layer, if any)."""
    roles = decoder.role_formats()
    counts: dict[str, int] = {}
    for by_format in roles.values():
        for name, n in by_format.items():
            counts[name] = counts.get(name, 0) + n
    output = "none" if lm_head is None else formats.format_of(lm_head).name
    native = decoder.native is not None
    linears = [lin for layer in decoder.layers for lin in layer.linears()]
    return ForwardPlan(
        backend="native" if native else "reference",
        variant=kernels.variant() if native else None,
        attention=("native rows (C), in the same call" if native
                   else "torch sdpa, one call per row"),
        formats=counts, layers=roles, output=output,
        dtype=str(decoder.dtype).removeprefix("torch."),
        rows_per_pass=kernels.max_rows() if native else 0,
        row_invariant=all(formats.format_of(lin).row_independent for lin in linears),
        why_reference=decoder.why_reference)


def forward_for(model: Any, lm_head: Any = None) -> Forward:
    """The :class:`Forward` of ``model`` (logits from ``lm_head`` when given); raises
    :class:`UnsupportedModelError` for a model it does not compute."""
    return Forward(model, lm_head)
