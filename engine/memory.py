"""Memory checks before the engine takes memory: converting a GGUF, loading a model.

Contract: :func:`check_memory` raises :class:`InsufficientMemoryError` (saying how much
is needed, how much is free and what to do) when an estimate does not fit in the memory
available now; nothing is allocated before it passes. The estimates come from file sizes
and tensor shapes alone, and were measured here as the peak RSS of a fresh process
(2026-12-01): converting Qwen2.5-Coder 1.5B's Q4_K_M GGUF tensor by tensor 3.3 GiB (the
file, mapped, plus its largest tensor dense: the 0.9 GiB embedding), SmolLM2 135M's
0.6 GiB; through transformers (other architectures) 8.7 GiB and 1.1 GiB (6.6 and 0.5
GiB of float32 weights); loading the Qwen pair onto the int4 kernels from their built
caches 2.6 GiB (the estimate: 4.1 GiB).
"""

from pathlib import Path

import numpy as np
import psutil

from engine.errors import InsufficientMemoryError

HEADROOM = 1.15  # activations, KV cache and allocator slack on top of the weights
RUNTIME_BYTES = 1 << 30  # Python, torch, transformers, the tokenizers (~0.5 GiB measured)
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
    from engine.convert import STREAMED
    from engine.cpu.gguf import read_gguf  # numpy memory map of the header and tensors

    fields, tensors = read_gguf(gguf)
    elements = [int(np.prod(t.shape, dtype=np.int64)) for t in tensors.values()]
    if fields.get("general.architecture") in STREAMED:  # engine.convert: one at a time
        return int(gguf.stat().st_size + max(elements, default=0) * 4 * STREAM_FACTOR)
    return int(sum(elements) * 4 * CONVERSION_FACTOR)
