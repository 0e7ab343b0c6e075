"""A GGUF file into a float32 safetensors folder, one tensor at a time.

Contract: :func:`convert_streaming` writes into a folder what transformers' own GGUF
loading followed by ``save_pretrained`` writes (``config.json``,
``generation_config.json``, the tokenizer files, ``model.safetensors`` with the same
tensors, bit for bit; tested on the light model) while holding one dequantized tensor at
a time: transformers' way holds every dense tensor and the model at once (peaks in
docs/measurements.md). What the names, the config and the order of Llama's q/k rows
mean comes from transformers' own GGUF tables (``load_gguf_checkpoint`` for the
metadata, ``TENSOR_PROCESSORS``, ``get_gguf_hf_weights_map`` on a model built on the
meta device) and the numbers from gguf-py's ``dequantize``, as there. Architectures
other than :data:`STREAMED` are left to transformers (:func:`streams` says which).
"""

import functools
import json
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from engine.cpu.gguf import GGUFTensor, read_gguf

log = logging.getLogger(__name__)

STREAMED = frozenset({"llama", "qwen2"})  # GGUF architectures whose tensors map one to one
HEADER_ALIGN = 8  # safetensors pads its JSON header to a multiple of 8 bytes


def streams(gguf: Path) -> bool:
    """Whether :func:`convert_streaming` handles this file's architecture."""
    fields, _ = read_gguf(gguf)
    return fields.get("general.architecture") in STREAMED


def safetensors_header(entries: list[tuple[str, tuple[int, ...]]]) -> bytes:
    """The length-prefixed JSON header of float32 tensors ``(name, shape)`` stored one
    after another in that order."""
    described: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in entries:
        size = 4 * int(np.prod(shape, dtype=np.int64))
        described[name] = {"dtype": "F32", "shape": list(shape),
                           "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(described, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % HEADER_ALIGN)
    return len(text).to_bytes(8, "little") + text


@contextmanager
def one_name_table() -> Iterator[None]:
    """Within the block, gguf-py builds each architecture's tensor-name table once.

    transformers' ``get_gguf_hf_weights_map`` calls itself for every submodule (about 400
    for a 30-layer model) and each call builds ``gguf.get_tensor_name_map(arch, layers)``
    anew: 12 s of the light model's conversion on the Zen 1 machine. The table depends only
    on its two arguments and is only read, so one per pair serves every call."""
    import gguf

    built = gguf.get_tensor_name_map
    gguf.get_tensor_name_map = functools.cache(built)
    try:
        yield
    finally:
        gguf.get_tensor_name_map = built


def _tensor_plan(gguf: Path) -> tuple[list[tuple[GGUFTensor, str, tuple[int, ...]]], Any, Any]:
    """A plan: each GGUF tensor that maps to a parameter, with the parameter's name and
    shape; plus the tensor processor and the empty (meta) model, with its config."""
    import torch
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import (
        TENSOR_PROCESSORS,
        TensorProcessor,
        get_gguf_hf_weights_map,
        load_gguf_checkpoint,
    )

    fields, tensors = read_gguf(gguf)
    described = load_gguf_checkpoint(str(gguf), return_tensors=False)["config"]  # no tensors
    config = CONFIG_MAPPING[described["model_type"]].from_dict(dict(described))  # as AutoConfig
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    processor = TENSOR_PROCESSORS.get(fields["general.architecture"], TensorProcessor)(
        config=described)
    with one_name_table():
        names = get_gguf_hf_weights_map(model, processor)
    params = dict(model.named_parameters())
    plan = []
    for tensor in tensors.values():
        if tensor.name not in names:
            continue
        name = names[tensor.name]
        shape = tuple(reversed(tensor.shape))
        if name in params and tuple(params[name].shape) != shape:
            raise ValueError(f"{gguf.name}: tensor {tensor.name} has shape {shape}, but the "
                             f"model's {name} needs {tuple(params[name].shape)}")
        plan.append((tensor, name, shape))
    return plan, processor, model


def convert_streaming(gguf: Path, out: Path, progress: Callable[[float, str], None]) -> None:
    """Write ``gguf`` as a float32 safetensors model folder ``out`` (created; see module)."""
    import torch
    from gguf import dequantize
    from transformers import AutoTokenizer

    out.mkdir(parents=True)
    progress(0.02, f"reading the tokenizer of {gguf.name}")
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out)
    progress(0.08, f"reading {gguf.name}")
    plan, processor, model = _tensor_plan(gguf)
    model.config.architectures = [type(model).__name__]
    model.config.dtype = torch.float32
    model.config.save_pretrained(out)
    model.generation_config.save_pretrained(out)
    with open(out / "model.safetensors", "wb") as f:
        f.write(safetensors_header([(name, shape) for _, name, shape in plan]))
        for i, (tensor, _, shape) in enumerate(plan):
            progress(0.1 + 0.85 * i / max(len(plan), 1),
                     f"dequantizing tensor {i + 1}/{len(plan)}")
            rows = dequantize(tensor.data, tensor.qtype).reshape(shape)  # as GGUFReader's
            weights = processor.process(weights=rows, name=tensor.name).weights
            dense = np.ascontiguousarray(weights, dtype=np.float32)
            if dense.shape != shape:
                raise ValueError(f"{gguf.name}: {tensor.name} dequantized to {dense.shape}, "
                                 f"not {shape}")
            f.write(dense.data)  # the array's own bytes, no copy
    log.info("converted %s tensor by tensor (%d tensors)", gguf.name, len(plan))
