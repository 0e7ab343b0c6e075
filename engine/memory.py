"""Memory checks before the engine takes memory: converting a GGUF, loading a model.

Contract: :func:`check_memory` raises :class:`InsufficientMemoryError` (saying how much
is needed, how much is free and what to do) when an estimate does not fit in the memory
available now; nothing is allocated before it passes. The estimates come from file sizes
and tensor shapes alone, and were measured here as the peak RSS of a fresh process
(2026-12-01): converting Qwen2.5-Coder 1.5B's Q4_K_M GGUF 8.7 GiB (6.6 GiB of float32
weights), SmolLM2 135M's 1.2 GiB (0.5 GiB); loading the Qwen pair onto the int4 kernels
from their built caches 2.6 GiB (the estimate: 4.1 GiB).
"""

from pathlib import Path

import numpy as np
import psutil

from engine.errors import InsufficientMemoryError

HEADROOM = 1.15  # activations, KV cache and allocator slack on top of the weights
RUNTIME_BYTES = 1 << 30  # Python, torch, transformers, the tokenizers (~0.5 GiB measured)
CONVERSION_FACTOR = 1.1  # converting holds the dense float32 weights and copies of some


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
    from engine.quant import read_gguf  # numpy memory map of the header and tensors

    _, tensors = read_gguf(gguf)
    elements = sum(int(np.prod(t.shape, dtype=np.int64)) for t in tensors.values())
    return int(elements * 4 * CONVERSION_FACTOR)
