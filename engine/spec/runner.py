"""One model, its KV cache, and the token ids that cache covers.

The runner is the only place the decoding core runs a model: it drives the model's
:class:`~engine.cpu.forward.Forward` (the engine's own forward pass) over a
:class:`~engine.cpu.forward.KVCache` kept across calls, with the list of ids the cache
holds, so callers roll back by cropping (``truncate``) and reuse a shared prefix
(``sync``) instead of ever slicing cache tensors by hand. The engine knows only token ids.

Keeping a cache in step with a shared prefix is :class:`PrefixCache`'s one job: the
target's and the draft model's runners are prefix caches, and so is an EAGLE head's cache
(whose entries lag its ids by one).

Every position is computed the same way however the ids reach the cache: the forward
computes each row independently of the others in its step (the row promise of
:mod:`engine.cpu.forward`), so a prompt read whole, read after a cached prefix or a parked
cache, an answer decoded step by step or verified k rows at a time all leave the same
cache, and a greedy answer cannot depend on what the runner served before.

With ``keep_hidden(True)`` the runner also keeps, for every cached position, the
target's final normed hidden state (the feature that feeds ``lm_head``), which EAGLE
heads draft from; plain decoding leaves it off and pays nothing for it.
``keep_hidden(True, taps)`` keeps wider features: the residual streams after layers
``taps`` beside the final normed state (what an EAGLE-3 head fuses; see
:meth:`~engine.cpu.forward.Forward.step`). Features of one width never mix with
another's: changing ``taps`` starts over as starting to keep them does.

:meth:`resume` keeps the caches of a few other conversations ("parked"): when a prompt
shares more with a parked cache than with the current one, the two swap, so a staff
member coming back to a chat after someone else's question does not wait for the whole
conversation to be read again.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from engine.cpu import TREE_ROWS, Head, KVCache, forward_for

PARKED = 4  # other conversations' caches kept by resume
PARKED_TOKENS = 16384  # positions they may hold together (Qwen 1.5B: 56 KiB each)
CONTINUING = 16  # a prompt that shares all but this many of a cache's ids continues it


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


class PrefixCache:
    """A cache kept in step with the token ids it was computed from.

    Entry ``i`` of ``cache`` (anything with ``len`` and ``crop(n)``, such as a
    :class:`~engine.cpu.forward.KVCache`) depends on ``ids[: i + 1 + lag]``: ``lag`` is 0
    for a model's own cache, whose entry ``i`` is position ``i``, and 1 for an EAGLE head's,
    whose entry ``i`` also reads the token after position ``i``. So the cache holds
    ``len(ids) - lag`` entries (none without ids). For a new sequence, :meth:`reusable`
    says how many entries still hold and :meth:`truncate` drops the rest.
    """

    def __init__(self, cache: Any, lag: int = 0) -> None:
        self.ids: list[int] = []
        self.cache = cache
        self.lag = lag

    def __len__(self) -> int:
        """Entries the cache holds."""
        return max(0, len(self.ids) - self.lag)

    def common_prefix(self, ids: Sequence[int]) -> int:
        """Length of the longest shared prefix of the cached ids and ``ids``."""
        return shared_prefix(self.ids, ids)

    def reusable(self, ids: Sequence[int]) -> int:
        """Entries that hold for a sequence starting with ``ids``."""
        return max(0, self.common_prefix(ids) - self.lag)

    def truncate(self, entries: int) -> None:
        """Drop the entries beyond ``entries``, and the ids only they depended on."""
        if entries < len(self.cache):
            self.cache.crop(entries)
        del self.ids[entries + self.lag if entries else 0 :]


class ModelRunner(PrefixCache):
    """Incremental forward passes over a growing (and croppable) token sequence."""

    tree_rows = TREE_ROWS  # rows one verification step holds, a draft tree's included

    def __init__(self, model: Any, lm_head: Any = None) -> None:
        self.model = model
        # the forward pass (with lm_head in place of the model's own, e.g. a drafter's
        # short output layer); UnsupportedModelError for a model it does not compute
        self.model_forward = forward_for(model, lm_head)
        super().__init__(self.model_forward.new_cache())
        self.cache: KVCache
        self.hidden: torch.Tensor | None = None  # [len(ids), F] while keeping features
        # the buffer ``hidden`` starts, with room for more rows (see :meth:`_grown`)
        self._room: torch.Tensor | None = None
        self.taps: tuple[int, ...] = ()  # layers whose residual streams the features add
        self.parked: list[Parked] = []  # most recently parked first
        self.park_limit = PARKED  # caches parked at most
        self.offset = 0  # where in the caller's sequence the cached ids begin (a window)

    def truncate(self, length: int) -> None:
        """Drop cached positions beyond ``length`` (rollback by cropping), features too."""
        super().truncate(length)
        if self.hidden is not None:
            self.hidden = self.hidden[: len(self.ids)]

    def reset(self) -> None:
        """Forget every cached position, parked caches included."""
        self.ids = []
        self.cache = self.model_forward.new_cache()
        self.parked = []
        self.offset = 0
        if self.hidden is not None:
            self.hidden = self.hidden[:0]

    def resume(self, ids: Sequence[int]) -> int:
        """Continue from the cache that shares most of ``ids``: the current one or a parked
        one. A cache that ``ids`` continue (all but its last :data:`CONTINUING` positions
        shared: a follow-up question) is taken as it is, a parked one swapping places with
        the current one. A cache of another conversation (nothing shared, only a system
        prompt or the chat template, or an earlier message edited) is kept whole, parked,
        and a copy of the shared part continues instead, so that conversation stays cached for when
        it comes back. Returns how many of ``ids`` are cached now; :meth:`sync` feeds the
        rest."""
        shared = self.common_prefix(ids)
        keeping = self.hidden is not None
        shares = [shared_prefix(p.ids, ids) if not keeping or self._fits(p.hidden) else -1
                  for p in self.parked]  # -1: no features of the width kept now
        best = max(range(len(shares)), default=None, key=shares.__getitem__)
        if best is not None and shares[best] > shared:
            chosen = self.parked[best]
            if shares[best] >= len(chosen.ids) - CONTINUING:
                self.swap_in(best)
            else:
                self._continue_from(chosen, shares[best], keeping)
            return shares[best]
        if shared < len(self.ids) - CONTINUING or (self.ids and not shared):
            self._continue_from(Parked(self.ids, self.cache, self.hidden, self.offset), shared,
                                keeping)
        return shared

    def cached(self, ids: Sequence[int], features: bool) -> int:
        """How many of ``ids`` :meth:`resume` would find cached, with features kept
        (``features``: only caches that hold them count) or not."""
        own = self.common_prefix(ids) if not features or self.hidden is not None else 0
        return max([own, *(shared_prefix(p.ids, ids) for p in self.parked
                           if not features or self._fits(p.hidden))])

    def _fits(self, hidden: torch.Tensor | None) -> bool:
        """Whether parked features are of the width kept now (or, kept none, of any)."""
        if hidden is None:
            return False
        return self.hidden is None or hidden.shape[-1] == self.hidden.shape[-1]

    def swap_in(self, index: int) -> None:
        """Continue from parked cache ``index``; the current one is parked in its place.
        Its features come along only while features are kept (it must have them then)."""
        chosen = self.parked.pop(index)
        keeping = self.hidden is not None
        self._park()
        self.ids, self.cache, self.offset = chosen.ids, chosen.cache, chosen.offset
        self.hidden = chosen.hidden if keeping else None

    def _continue_from(self, parked: Parked, length: int, keeping: bool) -> None:
        """Park the current cache and continue from a copy of ``parked``'s first
        ``length`` positions."""
        copy = parked.cache.prefix(length)
        hidden = None if not keeping or parked.hidden is None else parked.hidden[:length].clone()
        self._park()
        self.ids, self.cache, self.offset = parked.ids[:length], copy, parked.offset
        self.hidden = hidden

    def start_over(self, offset: int) -> None:
        """Park the current cache and start an empty one for ids from ``offset`` on."""
        self._park()
        self.ids, self.cache, self.offset = [], self.model_forward.new_cache(), offset
        if self.hidden is not None:
            self.hidden = self.hidden[:0]

    def _park(self) -> None:
        """Set the current cache aside (most recent first), dropping the oldest over budget.
        Its features are never written again: the next rows kept go into a new buffer."""
        self._room = None
        if self.ids:
            self.parked.insert(0, Parked(self.ids, self.cache, self.hidden, self.offset))
        while len(self.parked) > self.park_limit \
                or sum(len(p.ids) for p in self.parked) > PARKED_TOKENS:
            self.parked.pop()

    def keep_hidden(self, keep: bool, taps: Sequence[int] = ()) -> None:
        """Start or stop keeping features (with the residual streams of layers ``taps``).
        Starting, or changing ``taps``, parks the current cache (it has no features of
        that width; it comes back once they are off again) and starts an empty one."""
        if not keep:
            self.hidden = None
            return
        taps = tuple(int(t) for t in taps)
        if self.hidden is None or taps != self.taps:
            self.start_over(self.offset)
            self.taps = taps
            size = int(self.model.config.hidden_size) * (len(taps) + 1)
            self.hidden = torch.empty(0, size, dtype=self.model_forward.dtype)

    @torch.inference_mode()
    def forward(self, new_ids: Sequence[int], rows: int = 1, head: Head | None = None
                ) -> torch.Tensor:
        """Append ``new_ids`` to the cache; return logits of the last ``rows`` positions,
        from ``head`` in place of the output layer when given (its columns, e.g. a short
        head's kept ids only).

        Returns: ``[rows, V]`` float logits (``[rows, N]`` from ``head``).
        """
        ids = [int(t) for t in new_ids]
        logits, hidden = self.model_forward.read(ids, self.cache, rows, self.hidden is not None,
                                                 taps=self.taps, head=head)
        self._extend(ids, hidden)
        return logits  # [rows, V]

    def _extend(self, ids: list[int], hidden: torch.Tensor | None) -> None:
        self.ids.extend(ids)
        if self.hidden is not None and hidden is not None:
            self.hidden = self._grown(hidden)  # [len(ids), F]

    def _grown(self, rows: torch.Tensor) -> torch.Tensor:
        """The kept features followed by ``rows [n, F]``. They are written into the spare
        room of the buffer the features start (doubling it when full), not copied with
        every earlier row on each pass, a cost that grows with the context (figures in
        docs/measurements.md). A parked cache's features are never in that buffer
        (:meth:`_park` lets it go)."""
        assert self.hidden is not None
        have, need = len(self.hidden), len(self.hidden) + len(rows)
        room = self._room
        if room is None or room.data_ptr() != self.hidden.data_ptr() or need > len(room):
            room = torch.empty(max(2 * need, 64), self.hidden.shape[-1], dtype=self.hidden.dtype)
            room[:have] = self.hidden
            self._room = room
        room[have:need] = rows
        return room[:need]

    @torch.inference_mode()
    def forward_tree(self, new_ids: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        """Append a draft tree's rows (``parents[i]`` row ``i``'s parent, ``-1`` for row 0
        only, every other parent an earlier row; at most :data:`TREE_ROWS` rows) and return
        logits ``[T, V]`` of every row, each as a sequential forward of its path from row 0
        would give them. The cache then holds all rows; :meth:`keep_path` keeps one path."""
        ids = [int(t) for t in new_ids]
        logits, hidden = self.model_forward.step(ids, self.cache, len(ids),
                                                 self.hidden is not None, parents, self.taps)
        self._extend(ids, hidden)
        return logits  # [T, V]

    @torch.inference_mode()
    def keep_path(self, start: int, rows: Sequence[int]) -> None:
        """Of the positions from ``start`` on (a tree's rows), keep ``rows`` (ascending),
        moved down to follow ``start - 1``: cache, ids and kept features alike."""
        picked = [int(r) for r in rows]
        self.cache.keep(start, picked)
        self.ids[start:] = [self.ids[start + r] for r in picked]
        if self.hidden is not None:
            kept = self.hidden[start:][picked]  # a copy: its rows move down in place
            self.hidden = self.hidden[:start]
            self.hidden = self._grown(kept)

    def sync(self, ids: Sequence[int], head: Head | None = None) -> torch.Tensor | None:
        """Make the cache hold exactly ``ids``, reusing the shared prefix.

        Returns the logits ``[V]`` after the last id (``head``'s, as :meth:`forward`) when
        anything had to be fed, else ``None`` (the forward reads a long tail in bounded
        steps itself).
        """
        self.truncate(self.common_prefix(ids))
        if len(self.ids) == len(ids):
            return None
        return self.forward(ids[len(self.ids) :], rows=1, head=head)[-1]
