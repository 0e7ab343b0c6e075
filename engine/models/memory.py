"""Memory checks before the engine takes memory: converting a GGUF, loading a model.

Contract: :func:`check_memory` raises :class:`InsufficientMemoryError` (saying how much
is needed, how much is free and what to do) when an estimate does not fit in the memory
available now; nothing is allocated before it passes. The estimates come from file sizes
and tensor shapes alone, checked against the peak RSS of fresh processes (the figures:
docs/measurements.md): converting tensor by tensor holds the mapped file plus its largest
tensor dense; transformers' conversion (other architectures) holds every dense weight.
"""

from pathlib import Path

import numpy as np
import psutil

from engine.errors import InsufficientMemoryError

HEADROOM = 1.15  # activations, KV cache and allocator slack on top of the weights
RUNTIME_BYTES = 1 << 30  # Python, torch, transformers, the tokenizers, with room to spare
CONVERSION_FACTOR = 1.1  # transformers' conversion holds all dense weights, copies of some
STREAM_FACTOR = 2  # the tensor by tensor one: the largest tensor dense and a temporary


def check_memory(needed: int, what: str) -> None:
    """Raise :class:`InsufficientMemoryError` unless ``needed`` bytes of model data (plus
    headroom and the runtime) fit in the memory available now."""
    total = needed * HEADROOM + RUNTIME_BYTES
    available = psutil.virtual_memory().available
    if total > available:
        raise InsufficientMemoryError(
            f"{what} needs about {total / 2**30:.1f} GiB of memory but only "
            f"{available / 2**30:.1f} GiB is free; close other programs, choose the light "
            "profile, or use a smaller model"
        )


def conversion_bytes(gguf: Path) -> int:
    """About the model data converting ``gguf`` into float32 safetensors holds at once."""
    from engine.cpu.gguf import read_gguf  # numpy memory map of the header and tensors
    from engine.models.convert import STREAMED

    fields, tensors = read_gguf(gguf)
    elements = [int(np.prod(t.shape, dtype=np.int64)) for t in tensors.values()]
    if fields.get("general.architecture") in STREAMED:  # engine.models.convert: one at a time
        return int(gguf.stat().st_size + max(elements, default=0) * 4 * STREAM_FACTOR)
    return int(sum(elements) * 4 * CONVERSION_FACTOR)


SLOT_SHARE = 0.5  # of the memory available now that extra answers' caches may take


def slots_that_fit(per_slot: int, wanted: int) -> int:
    """How many of ``wanted`` answers can run together when each extra one needs
    ``per_slot`` bytes (its caches): at least 1, at most :data:`SLOT_SHARE` of the memory
    available now for the extra ones."""
    spare = psutil.virtual_memory().available * SLOT_SHARE
    return max(1, min(wanted, 1 + int(spare // max(1, per_slot))))
