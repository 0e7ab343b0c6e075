"""A drafter's output layer over the frequent part of the vocabulary (as FR-Spec, EAGLE-3).

Contract: :func:`short_head` wraps a model's output layer (its ``lm_head``) so that it
computes the logits of token ids ``0 .. size - 1`` plus a few named ids (end of turn,
end of text) and returns full-vocabulary logits ``[..., V]`` with ``-inf`` everywhere
else. BPE vocabularies number tokens in merge order, so low ids are the frequent ones
(on our benchmark's answers with Qwen2.5, ids below 65,536 carry 98.5 % of the tokens)
while the output layer is the largest single product of a drafting step (Qwen2.5 1.5B:
151,936 x 1,536 weights). A drafter using it never proposes another id; its
distribution ``q`` is the softmax over the kept ids and zero elsewhere, which is the
distribution its drafts are really drawn from, so acceptance stays lossless (greedy
drafts are the argmax over the kept ids). Rows of ``nn.Linear`` and of our row-major
quantized layers are sliced without copying the frequent part; any other layer, or a
vocabulary no larger than ``size``, is returned unchanged.
"""

from collections.abc import Iterable
from typing import Any, cast

import torch
from torch import nn

from engine.cpu.layers import Int8Linear, Q4KLinear, Q4Linear, Q6KLinear, Q8Linear, native_fits

DRAFT_VOCAB = 65536
ROW_MAJOR = (Q4Linear, Q4KLinear, Q6KLinear, Q8Linear, Int8Linear)


def select_rows(layer: nn.Module, rows: slice | torch.Tensor) -> nn.Module | None:
    """The output features ``rows`` of ``layer`` as a layer of the same kind, or None."""
    if isinstance(layer, nn.Linear):
        weight = layer.weight[rows].detach()  # [n, K]
        out = nn.Linear(layer.in_features, int(weight.shape[0]), bias=layer.bias is not None,
                        device="meta")
        out.weight = nn.Parameter(weight, requires_grad=False)
        if layer.bias is not None:
            out.bias = nn.Parameter(layer.bias[rows].detach(), requires_grad=False)
        return out
    if isinstance(layer, ROW_MAJOR):
        buffers = [getattr(layer, name)[rows] for name in layer.BUFFERS]
        bias = getattr(layer, "bias", None)
        return cast(Any, type(layer))(*buffers, bias=None if bias is None else bias[rows])
    return None


class ShortHead(nn.Module):
    """Logits of the first ``size`` ids and of ``extra`` ids; ``-inf`` for the rest."""

    extra_ids: torch.Tensor  # [E] ids at or above ``size`` computed by ``extra``

    def __init__(self, frequent: Any, extra: nn.Module | None, extra_ids: torch.Tensor,
                 vocab_size: int) -> None:
        super().__init__()
        self.frequent, self.extra = frequent, extra
        self.size = int(frequent.out_features)
        self.register_buffer("extra_ids", extra_ids)
        self.vocab_size = vocab_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.full((*x.shape[:-1], self.vocab_size), -torch.inf, dtype=x.dtype)  # [..., V]
        out[..., : self.size] = self.frequent(x)
        if self.extra is not None:
            out[..., self.extra_ids] = self.extra(x)
        return out


def as_int4(layer: Any) -> Any:
    """``layer`` re-rounded to 4 bits per 32 inputs on our kernels (:meth:`Q4Linear.from_dense`,
    about two thirds of Q6_K's bytes), or ``layer`` itself where the kernels cannot run it
    or its weight cannot be read. For drafting only: it changes which tokens are drafted,
    never which are accepted."""
    if isinstance(layer, Q4Linear) or not native_fits(int(layer.in_features)):
        return layer
    if isinstance(layer, nn.Linear) and layer.weight.dtype == torch.float32:
        weight = layer.weight.detach()
    elif isinstance(layer, (Q4KLinear, Q6KLinear)):
        weight = layer.dequantized()  # [N, K]
    else:
        return layer
    return Q4Linear.from_dense(weight, getattr(layer, "bias", None))


def short_head(lm_head: Any, extra_ids: Iterable[int], size: int = DRAFT_VOCAB,
               int4: bool = False) -> Any:
    """``lm_head`` restricted to ids below ``size`` plus ``extra_ids`` (see the module);
    with ``int4`` the kept frequent rows are re-rounded by :func:`as_int4`."""
    vocab = int(lm_head.out_features)
    if vocab <= size:
        return as_int4(lm_head) if int4 else lm_head
    frequent = select_rows(lm_head, slice(0, size))
    if frequent is None:
        return lm_head
    if int4:
        frequent = as_int4(frequent)
    ids = torch.tensor(sorted({int(i) for i in extra_ids if size <= int(i) < vocab}),
                       dtype=torch.long)
    extra = select_rows(lm_head, ids) if len(ids) else None
    return ShortHead(frequent, extra, ids, vocab)
