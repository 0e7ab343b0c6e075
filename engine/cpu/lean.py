"""A lean decoding step for Llama/Qwen2-style models: the same computation, less Python.

Contract: :func:`lean_step` returns a :class:`LeanStep` for models it supports (Llama
and Qwen2 causal LMs on :func:`engine.cpu.invariant.row_attention`, no sliding window),
else ``None``. ``step(ids, cache, rows, keep)`` feeds up to
:data:`engine.cpu.invariant.MAX_ROWS` new tokens at batch size 1 and returns the logits of
the last ``rows`` positions and, with ``keep``, the final normed hidden states: the
very tensors ``model(input_ids=..., cache=..., logits_to_keep=rows)`` returns, bit for
bit (same modules, same operations, same order; tested). It skips what a decoding step
at batch 1 does not need: mask building, output records, kwargs plumbing and module
hooks, about a fifth of a Qwen 1.5B step on this CPU; and on our kernels it computes
q, k, v and gate, up each in one native call (:func:`engine.cpu.layers.fused`, the same
numbers). Longer inputs (prefill) go through the model's own forward.

Where every linear layer runs on our kernels (float32, SiLU MLP, the cache a
:class:`engine.cpu.kvcache.GrowingLayer` per layer), the layers run instead as one native
call (:class:`NativeDecoder`, ``anve_decoder_step``): the same computation with RMSNorm,
rotary, SiLU and the residual adds in C, so the step costs the kernels and little else
(the draft model's step was a third Python and small torch ops). Its numbers then
differ from the model's forward within float32 rounding (norm sums, ``exp``), while the
property speculation rests on holds bit for bit: a k-row step gives each row exactly
what a one-row step gives (tested).

``batch_step(ids, caches)`` feeds one token to each of several independent sequences at
once (the linear layers read their weights once for all; answer generation for head
training uses it). :func:`native_stack` runs a bare decoder stack fed input embeddings
(an EAGLE head's layer) as one native call per step.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import Cache

from engine.cpu import kernels
from engine.cpu.invariant import MAX_ROWS, ROW_ATTENTION, row_attention
from engine.cpu.kvcache import GrowingLayer
from engine.cpu.layers import NativeLinear, fused

SUPPORTED = frozenset({"LlamaForCausalLM", "Qwen2ForCausalLM"})


@dataclass(frozen=True)
class _Layer:
    attn: Any  # the attention module (row_attention reads its settings)
    norm1: Any
    q: Any
    k: Any
    v: Any
    o: Any
    norm2: Any
    gate: Any
    up: Any
    down: Any
    act: Any
    qkv: Callable[[torch.Tensor], list[torch.Tensor]] | None  # q, k, v in one native call
    gate_up: Callable[[torch.Tensor], list[torch.Tensor]] | None


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _linears(layer: _Layer) -> list[Any]:
    return [layer.q, layer.k, layer.v, layer.o, layer.gate, layer.up, layer.down]


class NativeDecoder:
    """Every decoder layer of a model as one ``anve_decoder_step`` call.

    The C structs point into the layers' weight buffers (watched: a replaced buffer
    rebuilds them) and into each step's KV cache buffers.
    """

    def __init__(self, model: Any, layers: list[_Layer]) -> None:
        config, attn = model.config, layers[0].attn
        self.layers = layers
        self.heads, self.kv_heads = int(config.num_attention_heads), int(config.num_key_value_heads)
        self.head_dim = int(attn.head_dim)
        self.structs = (kernels.DecoderLayer * len(layers))()
        self.model = kernels.DecoderModel(
            len(layers), int(config.hidden_size), self.heads, self.kv_heads, self.head_dim,
            int(config.intermediate_size), float(layers[0].norm1.variance_epsilon),
            float(attn.scaling), self.structs)
        self._build()

    def _build(self) -> None:
        self._held: list[kernels.Layers] = []  # the calls whose arrays the structs point into
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
        watch = [(module._buffers, name, tensor)
                 for layer in self.layers
                 for module in (layer.norm1, layer.norm2, *_linears(layer))
                 for name, tensor in module._buffers.items()]
        watch += [(module._parameters, "weight", module.weight)
                  for layer in self.layers for module in (layer.norm1, layer.norm2)]
        # identities are safe to compare: _tensors keeps every watched tensor alive
        self._registries, self._names, self._tensors = zip(*watch, strict=True)
        self._ids = tuple(map(id, self._tensors))

    def _unchanged(self) -> bool:
        """Whether every watched registry still holds the very tensor the structs point
        into (one C-level pass: a Python loop over the ~1,200 entries cost ~1 ms a step)."""
        return tuple(map(id, map(dict.get, self._registries, self._names))) == self._ids

    def __call__(self, x: torch.Tensor, cache: list[GrowingLayer], cos: torch.Tensor,
                 sin: torch.Tensor, tree: torch.Tensor | None = None) -> torch.Tensor:
        """``x [1, T, H]`` through every layer, the new keys and values into ``cache``
        (the KV cache's layers, one per decoder layer); ``tree`` masks as
        :func:`engine.cpu.kernels.tree_masks`."""
        if not self._unchanged():
            self._build()
        t = x.shape[1]
        start = 0
        for struct, cache_layer in zip(self.structs, cache, strict=True):
            keys, values, start = cache_layer.room(t, self.kv_heads, self.head_dim,
                                                   torch.float32)
            struct.kbuf, struct.vbuf = keys.data_ptr(), values.data_ptr()
            struct.head_stride = keys.stride(1)
        x = x.contiguous()  # a fresh tensor (the embedding's output), updated in place
        kernels.decoder_step(self.model, x, start, cos.contiguous(), sin.contiguous(), tree)
        for cache_layer in cache:
            cache_layer.set_length(start + t)
        return x


def decoder_layers(inner: Any) -> list[_Layer]:
    """The decoder layers of a Llama/Qwen2 stack (``model.model``) as :class:`_Layer`."""
    return [
        _Layer(d.self_attn, d.input_layernorm, d.self_attn.q_proj, d.self_attn.k_proj,
               d.self_attn.v_proj, d.self_attn.o_proj, d.post_attention_layernorm,
               d.mlp.gate_proj, d.mlp.up_proj, d.mlp.down_proj, d.mlp.act_fn,
               fused([d.self_attn.q_proj, d.self_attn.k_proj, d.self_attn.v_proj]),
               fused([d.mlp.gate_proj, d.mlp.up_proj]))
        for d in inner.layers
    ]


def native_decoder(model: Any, layers: list[_Layer]) -> NativeDecoder | None:
    """A :class:`NativeDecoder` where the whole step can run natively, else ``None``
    (``model`` a causal LM or a bare decoder stack such as an EAGLE head's)."""
    config = model.config
    inner = getattr(model, "model", model)
    norms = [norm for layer in layers for norm in (layer.norm1, layer.norm2)]
    fits = (
        kernels.available()
        and getattr(config, "hidden_act", None) == "silu"
        and all(isinstance(lin, NativeLinear) for layer in layers for lin in _linears(layer))
        and all(getattr(n, "weight", None) is not None and n.weight.dtype == torch.float32
                and n.weight.is_contiguous() for n in norms)
        and len({getattr(n, "variance_epsilon", None) for n in norms}) == 1
        and len({float(layer.attn.scaling) for layer in layers}) == 1
        and int(layers[0].attn.head_dim) % 8 == 0
        and inner.embed_tokens.weight.dtype == torch.float32
    )
    return NativeDecoder(model, layers) if fits else None


class NativeStack:
    """A bare decoder stack fed input embeddings (an EAGLE head's ``LlamaModel``), its
    layers as one native call per step of up to :data:`MAX_ROWS` rows, then its final norm:
    what the stack's own forward returns as ``last_hidden_state``, within float32 rounding,
    at a fraction of the Python (a draft step of Qwen's head: 2.6 ms through transformers)."""

    def __init__(self, decoder: Any, native: NativeDecoder) -> None:
        self.rotary, self.norm, self.native = decoder.rotary_emb, decoder.norm, native

    def fits(self, rows: int, cache: Cache) -> bool:
        return rows <= MAX_ROWS and all(isinstance(c, GrowingLayer) for c in cache.layers)

    @torch.inference_mode()
    def __call__(self, x: torch.Tensor, cache: Cache) -> torch.Tensor:
        """``x [1, T, H]`` after the cached positions -> ``[1, T, H]``; the cache grows."""
        start, t = cache.get_seq_length(), x.shape[1]
        cos, sin = self.rotary(x, torch.arange(start, start + t)[None])  # [1, T, Dh] each
        growing = [c for c in cache.layers if isinstance(c, GrowingLayer)]
        return self.norm.forward(self.native(x, growing, cos, sin))


def native_stack(decoder: Any) -> NativeStack | None:
    """A :class:`NativeStack` for ``decoder`` where its layers run natively, else ``None``."""
    native = native_decoder(decoder, decoder_layers(decoder))
    return None if native is None else NativeStack(decoder, native)


class LeanStep:
    """Decoding and verification forwards of one supported model."""

    def __init__(self, model: Any, lm_head: Any = None) -> None:
        inner = model.model
        self.embed = inner.embed_tokens
        self.rotary = inner.rotary_emb
        self.norm = inner.norm
        self.lm_head = model.lm_head if lm_head is None else lm_head
        self.layers = decoder_layers(inner)
        self.native = native_decoder(model, self.layers)

    def _qkv(self, layer: _Layer, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rotated q, k and v of rows ``h [1, T, H]``, one position each: ``[1, T, heads, Dh]``."""
        t, dh = h.shape[1], layer.attn.head_dim
        if layer.qkv is not None:
            q, k, v = layer.qkv(h)
        else:
            q, k, v = layer.q.forward(h), layer.k.forward(h), layer.v.forward(h)
        q, k, v = (y.view(1, t, -1, dh) for y in (q, k, v))
        c, s = cos.unsqueeze(2), sin.unsqueeze(2)  # [1, T, 1, Dh]
        return (q * c) + (_rotate_half(q) * s), (k * c) + (_rotate_half(k) * s), v

    def _attend(self, layer: _Layer, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                cache: Cache, index: int, tree: torch.Tensor | None) -> torch.Tensor:
        """One sequence's new rows ``[1, T, heads, Dh]`` into its cache; their attention
        output ``[1, T, H * Dh]`` (before ``o``)."""
        t = q.shape[1]
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [1, heads, T, Dh]
        k, v = cache.update(k, v, index)  # [1, Hkv, L, Dh] each
        out, _ = row_attention(layer.attn, q, k, v, None, tree, dropout=0.0,
                               scaling=layer.attn.scaling, sliding_window=None)
        return out.reshape(1, t, -1)

    def _mlp(self, layer: _Layer, h: torch.Tensor) -> torch.Tensor:
        if layer.gate_up is not None:
            gate, up = layer.gate_up(h)
        else:
            gate, up = layer.gate.forward(h), layer.up.forward(h)
        return layer.down.forward(layer.act(gate) * up)

    def _layers(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: Cache,
                tree: torch.Tensor | None) -> torch.Tensor:
        for index, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, layer.norm1.forward(x), cos, sin)
            x = x + layer.o.forward(self._attend(layer, q, k, v, cache, index, tree).contiguous())
            x = x + self._mlp(layer, layer.norm2.forward(x))
        return x  # [1, T, H]

    @torch.inference_mode()
    def batch_step(self, ids: Sequence[int], caches: Sequence[Cache]
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """One new token ``ids[b]`` for each of several independent sequences, each after
        the positions of its own ``caches[b]``: the linear layers and the lm_head run once
        over all rows (what makes B answers cost far less than B one-row steps), attention
        runs per sequence over its own cache. Returns logits ``[B, V]`` and final normed
        hidden states ``[B, H]``. Torch computes the norms, rotary and SiLU here, so the
        numbers match a one-row :meth:`step` within float32 rounding, not bit for bit."""
        if not ids or len(ids) != len(caches):
            raise ValueError(f"a batch step takes one token per cache: {len(ids)} ids, "
                             f"{len(caches)} caches")
        x = self.embed.forward(torch.tensor([list(ids)], dtype=torch.long))  # [1, B, H]
        positions = torch.tensor([[cache.get_seq_length() for cache in caches]])  # [1, B]
        cos, sin = self.rotary(x, positions)  # [1, B, Dh] each
        for index, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, layer.norm1.forward(x), cos, sin)  # [1, B, heads, Dh]
            out = torch.cat([self._attend(layer, q[:, b : b + 1], k[:, b : b + 1],
                                          v[:, b : b + 1], cache, index, None)
                             for b, cache in enumerate(caches)], dim=1)  # [1, B, H * Dh]
            x = x + layer.o.forward(out)
            x = x + self._mlp(layer, layer.norm2.forward(x))
        x = self.norm.forward(x)  # [1, B, H]
        return self.lm_head.forward(x)[0], x[0]

    @torch.inference_mode()
    def step(self, ids: list[int], cache: Cache, rows: int, keep: bool,
             parents: Sequence[int] | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits ``[1, rows, V]`` and, with ``keep``, normed hidden states ``[1, T, H]``;
        ``rows=0`` skips the ``lm_head`` (the logits are then an empty ``[1, 0, 0]``).

        With ``parents`` (row ``i``'s parent row, ``-1`` for the first) the rows are a draft
        tree: each sits at the position after its parent's and attends to the cache and its
        ancestors only, and gets what it would get with them fed before it in sequence.
        """
        if not 0 < len(ids) <= MAX_ROWS:
            raise ValueError(f"a lean step takes 1..{MAX_ROWS} tokens, not {len(ids)}")
        x = self.embed.forward(torch.tensor([ids], dtype=torch.long))  # [1, T, H]
        start = cache.get_seq_length()
        tree, depth = None, list(range(len(ids)))  # depth: each row's place after the cache
        if parents is not None:
            tree, depth = kernels.tree_masks(parents), kernels.tree_depths(parents)  # [T] each
        cos, sin = self.rotary(x, torch.tensor([depth]) + start)  # [1, T, Dh] each
        growing = [c for c in cache.layers if isinstance(c, GrowingLayer)]
        if self.native is not None and len(growing) == len(cache.layers):
            x = self.native(x, growing, cos, sin, tree)
        else:
            x = self._layers(x, cos, sin, cache, tree)
        x = self.norm.forward(x)  # [1, T, H]
        logits = self.lm_head.forward(x[:, -rows:, :]) if rows else x[:, :0, :0]  # [1, rows, V]
        return logits, (x if keep else None)


def lean_step(model: Any, lm_head: Any = None) -> LeanStep | None:
    """A :class:`LeanStep` for ``model`` (its logits from ``lm_head`` when given), or
    ``None`` where the model's forward must be used."""
    config = model.config
    if type(model).__name__ not in SUPPORTED or config._attn_implementation != ROW_ATTENTION:
        return None
    layers = model.model.layers
    if any(getattr(d.self_attn, "sliding_window", None) for d in layers):
        return None
    if getattr(config, "pretraining_tp", 1) != 1 or getattr(config, "mlp_bias", False):
        return None
    return LeanStep(model, lm_head)
