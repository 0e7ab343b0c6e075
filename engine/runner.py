"""One model, its KV cache, and the token ids that cache covers.

The runner is the only place that calls a model's forward. It keeps a transformers
``DynamicCache`` (growing in place, :mod:`engine.kvcache`) across calls and the list
of ids the cache holds, so callers roll back by cropping (``truncate``) and reuse a
shared prefix (``sync``) instead of ever slicing cache tensors by hand. The engine
knows only token ids.

With ``keep_hidden(True)`` the runner also keeps, for every cached position, the
target's final normed hidden state (the feature that feeds ``lm_head``), which EAGLE
heads draft from; plain decoding leaves it off and pays nothing for it.
"""

from collections.abc import Sequence
from typing import Any

import torch

from engine.invariant import MAX_ROWS
from engine.kvcache import GrowingLayer, growing_cache
from engine.lean import lean_step

PREFILL_CHUNK = 512  # tokens per forward when filling the cache with a long prompt


class ModelRunner:
    """Incremental forward passes over a growing (and croppable) token sequence."""

    def __init__(self, model: Any, lm_head: Any = None) -> None:
        self.model = model
        self.ids: list[int] = []
        self.cache = growing_cache(model.config)
        self.hidden: torch.Tensor | None = None  # [len(ids), H] while keeping features
        # short forwards without transformers' plumbing (with lm_head in place of the
        # model's own, e.g. a drafter's short head; longer forwards keep the model's)
        self.lean = lean_step(model, lm_head)

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
        if self.hidden is not None:
            self.hidden = self.hidden[: len(self.ids)]

    def reset(self) -> None:
        self.ids = []
        self.cache = growing_cache(self.model.config)
        if self.hidden is not None:
            self.hidden = self.hidden[:0]

    def keep_hidden(self, keep: bool) -> None:
        """Start or stop keeping features; positions cached without one are dropped."""
        if not keep:
            self.hidden = None
            return
        if self.hidden is None:
            self.truncate(0)
            size = int(self.model.config.hidden_size)
            self.hidden = torch.empty(0, size, dtype=self.model.dtype)

    @torch.inference_mode()
    def forward(self, new_ids: Sequence[int], rows: int = 1) -> torch.Tensor:
        """Append ``new_ids`` to the cache; return logits of the last ``rows`` positions.

        Returns: ``[rows, V]`` float logits.
        """
        ids = [int(t) for t in new_ids]
        keep = self.hidden is not None
        if self.lean is not None and len(ids) <= MAX_ROWS:
            logits, hidden = self.lean.step(ids, self.cache, rows, keep)
        else:
            out = self.model(
                input_ids=torch.tensor([ids], dtype=torch.long), cache=self.cache,
                use_cache=True, logits_to_keep=rows, output_hidden_states=keep,
            )
            logits, hidden = out.logits, (out.hidden_states[-1] if keep else None)
        self.ids.extend(ids)
        if self.hidden is not None and hidden is not None:
            self.hidden = torch.cat([self.hidden, hidden[0]])  # [len(ids), H]
        return logits[0]  # [rows, V]

    @property
    def verifies_trees(self) -> bool:
        """Whether :meth:`forward_tree` runs here (a lean step over a growing cache)."""
        return self.lean is not None and all(
            isinstance(layer, GrowingLayer) for layer in self.cache.layers)

    @torch.inference_mode()
    def forward_tree(self, new_ids: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        """Append a draft tree's rows (``parents[i]`` row ``i``'s parent, ``-1`` for row 0
        only, every other parent an earlier row) and return logits ``[T, V]`` of every row,
        each as a sequential forward of its path from row 0 would give them. The cache
        then holds all rows; :meth:`keep_path` keeps one path."""
        ids = [int(t) for t in new_ids]
        if not self.verifies_trees or self.lean is None:
            raise ValueError("this model cannot verify a draft tree (no lean step)")
        if len(parents) != len(ids) or not 0 < len(ids) <= MAX_ROWS or parents[0] != -1 \
                or any(not 0 <= p < i for i, p in enumerate(parents) if i):
            raise ValueError(f"bad draft tree: {len(ids)} ids, parents {list(parents)}")
        logits, hidden = self.lean.step(ids, self.cache, len(ids), self.hidden is not None,
                                        parents)
        self.ids.extend(ids)
        if self.hidden is not None and hidden is not None:
            self.hidden = torch.cat([self.hidden, hidden[0]])  # [len(ids), H]
        return logits[0]  # [T, V]

    @torch.inference_mode()
    def keep_path(self, start: int, rows: Sequence[int]) -> None:
        """Of the positions from ``start`` on (a tree's rows), keep ``rows`` (ascending),
        moved down to follow ``start - 1``: cache, ids and kept features alike."""
        picked = [int(r) for r in rows]
        for layer in self.cache.layers:
            assert isinstance(layer, GrowingLayer)
            layer.keep(start, picked)
        self.ids[start:] = [self.ids[start + r] for r in picked]
        if self.hidden is not None:
            self.hidden = torch.cat([self.hidden[:start], self.hidden[start:][picked]])

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
