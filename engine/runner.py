"""One model, its KV cache, and the token ids that cache covers.

The runner is the only place that calls a model's forward. It keeps a transformers
``DynamicCache`` (growing in place, :mod:`engine.cpu.kvcache`) across calls and the list
of ids the cache holds, so callers roll back by cropping (``truncate``) and reuse a
shared prefix (``sync``) instead of ever slicing cache tensors by hand. The engine
knows only token ids.

Every position is computed the same way however the ids reach the cache: where the model
has a lean step (:mod:`engine.cpu.lean`, row-independent layers), every forward, a long
prompt's included, runs as lean steps of at most :data:`~engine.cpu.invariant.MAX_ROWS`
rows, so a position's keys, values, features and logits are bit for bit what one-row
decoding steps give it. A prompt read whole, read after a cached prefix or a parked
cache, an answer decoded step by step or verified k rows at a time then all leave the
same cache, and a greedy answer cannot depend on what the runner served before. (The
model's own forward over a long input is not row-independent: its attention blocks
the queries by their count, and its norms and rotary differ from the native step's in
the last bits; on SmolLM2 two splits of one 200-token prompt moved a logit by 0.5.)

With ``keep_hidden(True)`` the runner also keeps, for every cached position, the
target's final normed hidden state (the feature that feeds ``lm_head``), which EAGLE
heads draft from; plain decoding leaves it off and pays nothing for it.

:meth:`resume` keeps the caches of a few other conversations ("parked"): when a prompt
shares more with a parked cache than with the current one, the two swap, so a staff
member coming back to a chat after someone else's question does not wait for the whole
conversation to be processed again (~21 ms a token for the 1.5B target on this CPU:
a 1,000-token chat is 20 s before the first new token).
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from engine.cpu.invariant import MAX_ROWS
from engine.cpu.kvcache import GrowingLayer, growing_cache, prefix_copy
from engine.cpu.lean import lean_step

PREFILL_CHUNK = 512  # tokens per forward when filling the cache with a long prompt
PARKED = 4  # other conversations' caches kept by resume
PARKED_TOKENS = 16384  # positions they may hold together (Qwen 1.5B: 56 KiB each)


def shared_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of ``a`` and ``b``."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


@dataclass
class Parked:
    """A cache set aside by :meth:`ModelRunner.resume`, with what it covers."""

    ids: list[int]
    cache: Any
    hidden: torch.Tensor | None
    offset: int = 0  # where in its conversation the cached ids begin


class ModelRunner:
    """Incremental forward passes over a growing (and croppable) token sequence."""

    def __init__(self, model: Any, lm_head: Any = None) -> None:
        self.model = model
        self.ids: list[int] = []
        self.cache = growing_cache(model.config)
        self.hidden: torch.Tensor | None = None  # [len(ids), H] while keeping features
        self.parked: list[Parked] = []  # most recently parked first
        self.offset = 0  # where in the caller's sequence the cached ids begin (a window)
        # short forwards without transformers' plumbing (with lm_head in place of the
        # model's own, e.g. a drafter's short head; longer forwards keep the model's)
        self.lean = lean_step(model, lm_head)

    def __len__(self) -> int:
        return len(self.ids)

    def common_prefix(self, ids: Sequence[int]) -> int:
        """Length of the longest shared prefix of the cached ids and ``ids``."""
        return shared_prefix(self.ids, ids)

    def truncate(self, length: int) -> None:
        """Drop cached positions beyond ``length`` (rollback by cropping)."""
        extra = len(self.ids) - length
        if extra > 0:
            self.cache.crop(-extra)
            del self.ids[length:]
        if self.hidden is not None:
            self.hidden = self.hidden[: len(self.ids)]

    def reset(self) -> None:
        """Forget every cached position, parked caches included."""
        self.ids = []
        self.cache = growing_cache(self.model.config)
        self.parked = []
        self.offset = 0
        if self.hidden is not None:
            self.hidden = self.hidden[:0]

    def resume(self, ids: Sequence[int]) -> int:
        """Continue from the cache that shares most of ``ids``: the current one or a parked
        one (they swap). When the winner keeps less than half of the current cache (another
        conversation, or an earlier message edited), the current one is parked whole and a
        copy of the shared part continues instead of cutting it down. Returns how many of
        ``ids`` are cached now; :meth:`sync` feeds the rest."""
        shared = self.common_prefix(ids)
        shares = [shared_prefix(p.ids, ids) for p in self.parked]
        best = max(range(len(shares)), default=None, key=shares.__getitem__)
        keeping = self.hidden is not None
        if best is not None and shares[best] > shared \
                and (self.parked[best].hidden is not None or not keeping):
            self.swap_in(best)
            return shares[best]
        if 2 * shared < len(self.ids):
            copy = prefix_copy(self.cache, self.model.config, shared)
            ids, hidden = self.ids[:shared], None if self.hidden is None else self.hidden[:shared]
            self.start_over(self.offset)
            if copy is None:
                return 0
            self.ids, self.cache = ids, copy
            self.hidden = None if hidden is None else hidden.clone()
        return shared

    def swap_in(self, index: int) -> None:
        """Continue from parked cache ``index``; the current one is parked in its place.
        Its features come along only while features are kept (it must have them then)."""
        chosen = self.parked.pop(index)
        keeping = self.hidden is not None
        self._park()
        self.ids, self.cache, self.offset = chosen.ids, chosen.cache, chosen.offset
        self.hidden = chosen.hidden if keeping else None

    def start_over(self, offset: int) -> None:
        """Park the current cache and start an empty one for ids from ``offset`` on."""
        self._park()
        self.ids, self.cache, self.offset = [], growing_cache(self.model.config), offset
        if self.hidden is not None:
            self.hidden = self.hidden[:0]

    def _park(self) -> None:
        """Set the current cache aside (most recent first), dropping the oldest over budget."""
        if self.ids:
            self.parked.insert(0, Parked(self.ids, self.cache, self.hidden, self.offset))
        while len(self.parked) > PARKED or sum(len(p.ids) for p in self.parked) > PARKED_TOKENS:
            self.parked.pop()

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
        if self.lean is not None:
            logits, hidden = self._stepped(ids, rows, keep)
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

    def _stepped(self, ids: list[int], rows: int, keep: bool
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``ids`` as lean steps of at most :data:`MAX_ROWS` rows (see the module): logits
        ``[1, rows, V]`` of the last ``rows`` positions, features ``[1, T, H]`` with ``keep``."""
        assert self.lean is not None
        logits, features = [], []
        for start in range(0, len(ids), MAX_ROWS):
            chunk = ids[start : start + MAX_ROWS]
            after = len(ids) - start - len(chunk)  # positions after this chunk
            wanted = max(0, min(len(chunk), rows - after))
            out, hidden = self.lean.step(chunk, self.cache, wanted, keep)
            if wanted:
                logits.append(out)
            if hidden is not None:
                features.append(hidden)
        return torch.cat(logits, dim=1), (torch.cat(features, dim=1) if keep else None)

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
