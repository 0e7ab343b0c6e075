"""A transformers KV cache that grows in place instead of concatenating every step.

Contract: :func:`growing_cache` returns a ``DynamicCache`` whose full-attention layers
keep keys and values in buffers with spare room (capacity doubles when full), so a
decoding step writes its new positions instead of copying the whole cache, and
``crop`` only moves the length back (``keep`` also moves a draft tree's accepted path
down over the rest). Callers see what ``DynamicCache`` gives: ``keys``
and ``values`` are ``[B, H, length, Dh]`` (views of the buffers), the same numbers in
the same layout. Sliding-window layers keep transformers' own class.
"""

from itertools import pairwise
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

MIN_CAPACITY = 256  # positions allocated at first use


class GrowingLayer(DynamicLayer):
    """A full-attention cache layer over preallocated, growable buffers."""

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._key_buf: torch.Tensor | None = None  # [B, H, capacity, Dh]
        self._value_buf: torch.Tensor | None = None
        self._length = 0

    def _reserve(self, key_states: torch.Tensor, value_states: torch.Tensor, needed: int) -> None:
        capacity = 0 if self._key_buf is None else self._key_buf.shape[-2]
        if needed <= capacity:
            return
        size = max(needed, 2 * capacity, MIN_CAPACITY)
        key_buf = key_states.new_empty((*key_states.shape[:-2], size, key_states.shape[-1]))
        value_buf = value_states.new_empty((*value_states.shape[:-2], size, value_states.shape[-1]))
        if self._length and self._key_buf is not None and self._value_buf is not None:
            key_buf[..., : self._length, :] = self._key_buf[..., : self._length, :]
            value_buf[..., : self._length, :] = self._value_buf[..., : self._length, :]
        self._key_buf, self._value_buf = key_buf, value_buf

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, new = self._length, key_states.shape[-2]
        self._reserve(key_states, value_states, start + new)
        assert self._key_buf is not None and self._value_buf is not None
        self._key_buf[..., start : start + new, :] = key_states
        self._value_buf[..., start : start + new, :] = value_states
        return self.set_length(start + new)

    def room(self, new: int, heads: int, head_dim: int, dtype: torch.dtype
             ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Buffers ``[1, heads, capacity, head_dim]`` (keys, values) with room for ``new``
        more positions, and the first of them: for a caller that writes them itself and
        then calls :meth:`set_length`."""
        start = self._length if self.is_initialized else 0
        if not self.is_initialized or self._key_buf is None or (
                self._key_buf.shape[-2] < start + new):
            empty = torch.empty(1, heads, 0, head_dim, dtype=dtype)
            if not self.is_initialized:
                self.lazy_initialization(empty, empty)
            self._reserve(empty, empty, start + new)
        assert self._key_buf is not None and self._value_buf is not None
        return self._key_buf, self._value_buf, start

    def set_length(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        assert self._key_buf is not None and self._value_buf is not None
        self._length = length
        keys = self._key_buf[..., :length, :]  # [B, H, length, Dh]
        values = self._value_buf[..., :length, :]
        self.keys, self.values = keys, values
        return keys, values

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes the negative number of positions to remove")
        if tokens_to_remove == 0 or not self.is_initialized or self._key_buf is None:
            return
        self.set_length(max(0, self._length + tokens_to_remove))

    def keep(self, start: int, rows: list[int]) -> None:
        """Keep, of the positions from ``start`` on, only ``rows`` (ascending offsets from
        ``start``), moved down to sit contiguously after ``start - 1``: the accepted path
        of a draft tree. Positions below ``start`` are untouched."""
        if not self.is_initialized or self._key_buf is None or self._value_buf is None:
            raise ValueError("keep needs a filled cache layer")
        if any(b <= a for a, b in pairwise(rows)) or (
                rows and (rows[0] < 0 or start + rows[-1] >= self._length)):
            raise ValueError(f"rows must ascend within the {self._length - start} from {start}")
        picked = torch.tensor(rows, dtype=torch.long) + start
        for buf in (self._key_buf, self._value_buf):
            buf[..., start : start + len(rows), :] = buf.index_select(-2, picked)
        self.set_length(start + len(rows))

    def reset(self) -> None:
        self._key_buf = self._value_buf = None
        self._length = 0
        super().reset()


def prefix_copy(cache: DynamicCache, config: Any, length: int) -> DynamicCache | None:
    """A new growing cache holding a copy of ``cache``'s first ``length`` positions, or
    ``None`` when one of its layers cannot be cut that way (a sliding window's)."""
    copy = growing_cache(config)
    if length == 0:
        return copy
    for old, new in zip(cache.layers, copy.layers, strict=True):
        if not isinstance(old, GrowingLayer) or not old.is_initialized or old._length < length:
            return None
        assert isinstance(new, GrowingLayer) and old.keys is not None and old.values is not None
        new.update(old.keys[..., :length, :], old.values[..., :length, :])  # copies
    return copy


def growing_cache(config: Any) -> DynamicCache:
    """A ``DynamicCache`` for ``config`` with :class:`GrowingLayer` full-attention layers."""
    cache = DynamicCache(config=config)
    cache.layers = [GrowingLayer() if type(layer) is DynamicLayer else layer
                    for layer in cache.layers]
    return cache
