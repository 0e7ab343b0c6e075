"""Row-by-row attention, so that verifying k tokens computes exactly what decoding does.

Contract: with :data:`ROW_ATTENTION` set on a model (:func:`use_row_attention`), a
forward over ``q <= MAX_ROWS`` new tokens at batch size 1 computes each query row with
the very call a one-token decoding step makes: ``sdpa`` over that row's causal prefix
of the cache, no mask. Attention output row ``i`` is therefore bit-identical to what
feeding the tokens one at a time gives. Longer inputs (prefill) and batches use plain
``sdpa`` with its usual causal mask, as do sliding-window layers. Assumes no padding
(the engine decodes one unpadded sequence).

Where the native kernels run (:func:`engine.cpu.kernels.row_attention`), float32 rows go
through one C call that computes each row the same way, in place of one ``sdpa`` call
per row (about 0.2 ms each on this CPU, 28 layers deep).

Why: torch's attention and float32 ``F.linear`` pick different kernels for 1 and k rows,
so a k-token verification differs from k decoding steps in the last bits; bfloat16
activations (the int4 path) amplify that to ~0.3 in the logits. With every linear
layer on a row-independent kernel (``Int4Linear``, ``Int8Linear``: row results do
not depend on the row count) and this attention, the whole forward is row-invariant,
and greedy speculative decoding emits exactly the tokens of plain greedy decoding.
"""

import logging
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from engine.cpu import kernels

log = logging.getLogger(__name__)

ROW_ATTENTION = "anve_rows"
MAX_ROWS = 16  # up to this many new tokens per forward attention runs row by row


def row_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [B, H, q, Dh]
    key: torch.Tensor,  # [B, Hkv, L, Dh], the cache including the q new positions
    value: torch.Tensor,  # [B, Hkv, L, Dh]
    attention_mask: torch.Tensor | None,
    tree: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention as transformers calls it; returns ``[B, q, H, Dh]``.

    With ``tree`` (:func:`engine.cpu.kernels.tree_masks`, lean steps only) the new rows are
    a draft tree's: row ``i`` sees the cache before them and the rows its mask names,
    in order, as if they sat contiguously before it.
    """
    q_len, kv_len = query.shape[2], key.shape[2]
    if tree is None and (query.shape[0] != 1 or q_len > MAX_ROWS
                         or getattr(module, "sliding_window", None)):
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    if native_fits(query, key, value, kwargs):
        scaling = kwargs.get("scaling") or query.shape[-1] ** -0.5
        return kernels.row_attention(query, key, value, float(scaling), tree), None
    rows = []
    before = kv_len - q_len  # cached positions before the new rows
    for i in range(q_len):
        if tree is None:
            k, v = key[:, :, : before + i + 1], value[:, :, : before + i + 1]
        else:
            seen = [before + j for j in range(q_len) if int(tree[i]) >> j & 1]
            k = torch.cat([key[:, :, :before], key[:, :, seen]], dim=2)
            v = torch.cat([value[:, :, :before], value[:, :, seen]], dim=2)
        out, _ = sdpa_attention_forward(module, query[:, :, i : i + 1], k, v, None, **kwargs)
        rows.append(out)  # [1, 1, H, Dh]
    return torch.cat(rows, dim=1), None


def native_fits(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kwargs: dict[str, Any]) -> bool:
    """Whether the native row attention computes this call (plain causal float32)."""
    plain = not kwargs.get("dropout") and kwargs.get("softcap") is None
    shapes = query.shape[-1] % 8 == 0 and query.shape[1] % key.shape[1] == 0
    floats = all(t.dtype == torch.float32 for t in (query, key, value))
    return plain and shapes and floats and kernels.available()


AttentionInterface.register(ROW_ATTENTION, row_attention)
AttentionMaskInterface.register(ROW_ATTENTION, sdpa_mask)


def use_row_attention(model: Any) -> None:
    """Switch a transformers model to :func:`row_attention` (in place)."""
    model.set_attn_implementation(ROW_ATTENTION)
    log.info("attention: row by row for up to %d new tokens", MAX_ROWS)
