"""One model, its KV cache, and the token ids that cache covers.

The runner is the only place that calls a model's forward. It keeps a transformers
``DynamicCache`` across calls and the list of ids the cache holds, so callers roll
back by cropping (``truncate``) and reuse a shared prefix (``sync``) instead of ever
slicing cache tensors by hand. The engine knows only token ids.
"""

from collections.abc import Sequence
from typing import Any

import torch
from transformers import DynamicCache

PREFILL_CHUNK = 512  # tokens per forward when filling the cache with a long prompt


class ModelRunner:
    """Incremental forward passes over a growing (and croppable) token sequence."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.ids: list[int] = []
        self.cache = DynamicCache(config=model.config)

    def __len__(self) -> int:
        return len(self.ids)

    def common_prefix(self, ids: Sequence[int]) -> int:
        """Length of the longest shared prefix of the cached ids and ``ids``."""
        n = min(len(self.ids), len(ids))
        for i in range(n):
            if self.ids[i] != ids[i]:
                return i
        return n

    def truncate(self, length: int) -> None:
        """Drop cached positions beyond ``length`` (rollback by cropping)."""
        extra = len(self.ids) - length
        if extra > 0:
            self.cache.crop(-extra)
            del self.ids[length:]

    def reset(self) -> None:
        self.ids = []
        self.cache = DynamicCache(config=self.model.config)

    @torch.inference_mode()
    def forward(self, new_ids: Sequence[int], rows: int = 1) -> torch.Tensor:
        """Append ``new_ids`` to the cache; return logits of the last ``rows`` positions.

        Returns: ``[rows, V]`` float logits.
        """
        x = torch.tensor([list(new_ids)], dtype=torch.long)  # [1, T]
        out = self.model(input_ids=x, cache=self.cache, use_cache=True, logits_to_keep=rows)
        self.ids.extend(int(t) for t in new_ids)
        return out.logits[0]  # [rows, V]

    def sync(self, ids: Sequence[int]) -> torch.Tensor | None:
        """Make the cache hold exactly ``ids``, reusing the shared prefix.

        Returns the logits ``[V]`` after the last id when anything had to be fed,
        else ``None``. Long tails are fed in chunks to bound attention memory.
        """
        self.truncate(self.common_prefix(ids))
        logits = None
        while len(self.ids) < len(ids):
            chunk = ids[len(self.ids) : len(self.ids) + PREFILL_CHUNK]
            logits = self.forward(chunk, rows=1)[-1]
        return logits
