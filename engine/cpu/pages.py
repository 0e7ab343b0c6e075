"""Quantized weights in transparent huge pages (Linux), so streaming them costs fewer page walks.

Contract: :func:`to_huge_pages` moves the weight buffers of the given layers (each with
``BUFFERS`` naming them, as :class:`engine.cpu.layers.NativeLinear`) and their biases
(so no tensor keeps the converted-weights file mapped once it is copied) into one anonymous
memory arena that the kernel is asked to back with 2 MiB pages (``madvise(MADV_HUGEPAGE)``,
honoured where ``/sys/kernel/mm/transparent_hugepage/enabled`` says ``always`` or
``madvise``). The values are copied unchanged and the layers keep working as before; only
where the buffers live changes. A decoding step reads every weight once, about 1 GB for
the appliance target: with 4 KiB pages that is a page-table walk every 4 KiB of each of a
layer's several arrays, and the CPU's prefetchers stop at every page boundary (the A/B:
docs/measurements.md). Returns the bytes moved; 0 (and nothing changes) where the platform has no
``MADV_HUGEPAGE`` or private anonymous maps.
"""

import logging
import mmap
from collections.abc import Iterable
from typing import Any

import torch

log = logging.getLogger(__name__)

HUGE_PAGE = 2 << 20  # bytes; the arena starts on this boundary
ALIGN = 64  # bytes; every buffer starts on a cache line


def _padded(nbytes: int) -> int:
    return (nbytes + ALIGN - 1) // ALIGN * ALIGN


def to_huge_pages(layers: Iterable[Any]) -> int:
    """Move each layer's ``BUFFERS`` and bias into one huge-page arena; returns the bytes."""
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    private = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
    moves = [(layer, name, layer._buffers[name]) for layer in layers
             for name in (*layer.BUFFERS, "bias")
             if isinstance(layer._buffers.get(name), torch.Tensor)]
    total = sum(_padded(t.numel() * t.element_size()) for _, _, t in moves)
    if advice is None or not private or total == 0:
        return 0
    arena = mmap.mmap(-1, total + HUGE_PAGE, flags=private)  # shared memory has no THP here
    arena.madvise(advice)
    memory = torch.frombuffer(arena, dtype=torch.uint8)  # keeps the arena alive
    offset = -memory.data_ptr() % HUGE_PAGE
    for layer, name, tensor in moves:
        nbytes = tensor.numel() * tensor.element_size()
        moved = memory[offset : offset + nbytes].view(tensor.dtype).view(tensor.shape)
        moved.copy_(tensor)
        layer._buffers[name] = moved
        offset += _padded(nbytes)
    log.info("moved %d MiB of weights into huge pages", total >> 20)
    return total
