"""Convert a loaded Hugging Face model in place to the fast CPU layers; cache the result.

Contract of :func:`accelerate`: it replaces every ``nn.Linear`` of the model according
to the mode, and the same converted model then serves plain decoding and verification
(losslessness holds against the weights that actually run).

==============  ==============================================================
``"off"``       nothing changes
``"fp32"``      :class:`FastLinear` everywhere: same float weights, outputs equal
                ``F.linear`` within float32 rounding
``"int4"``      every Q4_0/Q4_1/Q4_K tensor of the GGUF as :class:`Int4Linear`
                (the GGUF's own codes, scale/zero rounded to bfloat16), the rest
                (Q6_K, Q8_0, F16, ...) as :class:`FastLinear` on the dense weights
``"int4+int8"`` as ``"int4"`` but the rest as :class:`Int8Linear` (per-channel int8
                re-quantization: ~1 % RMS weight error); every layer then has a
                row-independent format, so the forward is row-invariant
==============  ==============================================================

Where our kernels run (:mod:`engine.cpu.kernels`: AVX2 and a compiler), the int4 modes use
:class:`Q4Linear` (:class:`Q4KLinear` for Q4_K tensors: their exact integer form) and
:class:`Q8Linear` in place of :class:`Int4Linear` and :class:`Int8Linear`, and Q6_K
tensors run exactly as :class:`Q6KLinear` (:class:`Q6KPLinear`, the same weights with
6-bit codes, where the running kernel variant prefers it: :func:`kernels.q6k_form`):
integer-dot kernels, faster than torch's, equally row-invariant. With
``requantize`` (draft models only: a draft's numerics move its acceptance, never the
output) the tensors with no int4 form are rounded to 4 bits too
(:meth:`Q4Linear.from_dense`), so a draft reads fewer bytes per step. Our kernels'
weights are then moved into huge pages (:mod:`engine.cpu.pages`).

Int4 layers are built only where the decoded GGUF rows equal the loaded weight
(sampled check), so a GGUF that is not the model's source falls back to dense layers.
With ``cache_dir`` the converted layers are saved once (safetensors, keyed by mode,
torch version, CPU capability and the loaded weights' dtype) and later loads skip the
GGUF decoding: a few seconds instead of ~15 s for Qwen 1.5B.
"""

import json
import logging
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from engine.cpu import formats, kernels, pages
from engine.cpu.gguf import GGUFWeights, GroupQuant, Q6Blocks
from engine.cpu.layers import (
    BY_FORMAT,
    FastLinear,
    Int4Linear,
    Int8Linear,
    NativeLinear,
    Q4KLinear,
    Q4Linear,
    Q6KLinear,
    Q6KPLinear,
    Q8Linear,
    QuantizedLinear,
    native_fits,
)
from engine.protocol import ACCELERATIONS

log = logging.getLogger(__name__)

MODES = tuple(m for m in ACCELERATIONS if m != "auto")  # what accelerate() takes
CACHE_FORMAT = 7  # 2: Q4_K as Q4KLinear; 3: Q6_K as Q6KLinear; 4: Q4_K pair layout, uint8;
# 5: Q4_K and Q6_K codes in the kernels' order; 6: Q4_K's factors in one array of records;
# 7: q6kp's codes, scales and d in one block a super-block
Q4K_INPUTS = 256  # a Q4_K super-block
CACHE_LINE = 64  # bytes: where torch's kernels want their weights to start
_QUANT_LAYERS: dict[str, type[QuantizedLinear]] = {  # the cache names layers by class
    c.__name__: c for c in BY_FORMAT.values()
}


@dataclass
class AccelerationReport:
    """What :func:`accelerate` did: linear layers by weight format (:mod:`engine.cpu.formats`)
    and count, and weight bytes after."""

    mode: str
    layers: Counter[str] = field(default_factory=Counter)
    row_invariant: bool = False  # every linear layer row-independent
    fallbacks: list[str] = field(default_factory=list)  # int4 candidates kept dense
    weight_bytes: int = 0  # parameters + buffers of the model after conversion
    from_cache: bool = False

    def summary(self) -> str:
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(self.layers.items()))
        cached = " (from cache)" if self.from_cache else ""
        return f"{self.mode}: {kinds}; {self.weight_bytes / 2**20:.0f} MiB of weights{cached}"


def model_bytes(model: nn.Module) -> int:
    """Bytes held by a model's parameters and buffers (shared tensors counted once)."""
    seen: dict[int, int] = {}
    for t in [*model.parameters(), *model.buffers()]:
        seen[t.data_ptr()] = t.numel() * t.element_size()
    return sum(seen.values())


def _matches(g: GroupQuant | Q6Blocks, weight: torch.Tensor) -> bool:
    """Whether decoded GGUF rows equal the loaded weight's rows (sampled, cheap)."""
    n = g.shape[0]
    rows = torch.unique(torch.linspace(0, n - 1, steps=min(n, 16)).long())
    expected = weight.detach()[rows].float()  # [r, K]
    decoded = g.dequantize(rows)  # [r, K]
    if torch.equal(decoded, expected):
        return True
    tol = 1e-6 if weight.dtype == torch.float32 else 1e-2
    return bool(torch.allclose(decoded, expected, rtol=tol, atol=tol * 1e-2))


def _replacement(
    name: str,
    linear: nn.Linear,
    mode: str,
    weights: GGUFWeights | None,
    report: AccelerationReport,
    native: bool,
    requantize: bool = False,
    q6k_form: str = "q6k",
) -> nn.Module:
    """The layer that replaces ``linear`` in ``mode`` (recording fallbacks); Q6_K tensors
    on our kernels take the form ``q6k_form`` (``q6k`` or ``q6kp``)."""
    ours = native and linear.in_features % kernels.GROUP == 0
    g = weights.int4(name) if weights is not None and name in weights.tensors else None
    if g is not None and g.shape == tuple(linear.weight.shape):
        if _matches(g, linear.weight):
            if ours and g.superblocks is not None and linear.in_features % Q4K_INPUTS == 0:
                return Q4KLinear.from_groups(g, linear.bias)
            return (Q4Linear if ours else Int4Linear).from_groups(g, linear.bias)
        log.warning("%s: GGUF codes do not match the loaded weight; kept dense", name)
        report.fallbacks.append(name)
    blocks = weights.q6_k(name) if ours and weights is not None and name in weights.tensors \
        else None
    if blocks is not None and blocks.shape == tuple(linear.weight.shape) \
            and linear.in_features % Q4K_INPUTS == 0 and not requantize:
        if _matches(blocks, linear.weight):
            return (Q6KPLinear if q6k_form == "q6kp" else Q6KLinear).from_blocks(blocks,
                                                                                 linear.bias)
        log.warning("%s: GGUF Q6_K codes do not match the loaded weight; kept dense", name)
        report.fallbacks.append(name)
    if mode == "int4+int8" and ours and requantize:
        return Q4Linear.from_dense(linear.weight, linear.bias)
    if mode == "int4+int8":
        return (Q8Linear if ours else Int8Linear).from_weight(linear.weight, linear.bias)
    return FastLinear(linear)


def _linears(model: nn.Module) -> dict[str, nn.Linear]:
    return {n: m for n, m in model.named_modules() if type(m) is nn.Linear}


def _set_submodule(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, module)


def _q6k_form(native: bool, requantize: bool, asked: str | None = None) -> str:
    """The form Q6_K tensors convert to: ``asked``, else the running variant's
    (:func:`kernels.q6k_form`), on our kernels; ``q6k`` where none converts to a Q6_K
    form (torch's kernels, or a draft's tensors rounded to 4 bits)."""
    return (asked or kernels.q6k_form()) if native and not requantize else "q6k"


def cache_path(cache_dir: Path, mode: str, weight_dtype: torch.dtype, native: bool = False,
               requantize: bool = False, q6k_form: str | None = None) -> Path:
    """Where the converted layers of ``mode`` are cached (one file per build, and per form
    of the Q6_K tensors on our kernels: by default the running variant's,
    :func:`kernels.q6k_form`)."""
    capability = torch.backends.cpu.get_cpu_capability().lower()
    dtype = str(weight_dtype).removeprefix("torch.")
    kind = ("-native" if native else "") + ("-requantized" if native and requantize else "")
    form = _q6k_form(native, requantize, q6k_form)
    kind += f"-{form}" if form != "q6k" else ""
    tag = f"{mode.replace('+', '-')}{kind}-{dtype}-torch{torch.__version__}-{capability}"
    return Path(cache_dir) / f"accelerated-{tag}-v{CACHE_FORMAT}.safetensors"


def _source_tag(gguf_path: Path) -> str:
    """Which GGUF a cache was built from (name and size): a cheap identity check."""
    return f"{gguf_path.name}:{gguf_path.stat().st_size}"


def _drop_older_formats(paths: list[Path]) -> None:
    """Delete the caches of earlier formats of this build, ``paths`` being its current
    files (one per form of the Q6_K tensors): never read again, each the size of the
    model's weights (a gigabyte or two left behind by every update otherwise)."""
    for path in paths:
        stem, _, _ = path.stem.rpartition("-v")
        for old in path.parent.glob(f"{stem}-v*.safetensors"):
            version = old.stem.rpartition("-v")[2]
            if old not in paths and version.isdigit() and int(version) < CACHE_FORMAT:
                old.unlink(missing_ok=True)
                log.info("removed the outdated cache %s", old)


def _save_cache(path: Path, layers: dict[str, nn.Module], source: str,
                siblings: list[Path]) -> None:
    """Write the quantized layers' buffers atomically; dense layers are not stored."""
    kinds = {n: type(m).__name__ for n, m in layers.items() if type(m).__name__ in _QUANT_LAYERS}
    tensors = {f"{n}.{b}": t.contiguous() for n in kinds for b, t in layers[n].named_buffers()}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata={"kinds": json.dumps(kinds), "source": source})
    os.replace(tmp, path)
    _drop_older_formats([path, *siblings])
    log.info("cached %d converted layers in %s", len(kinds), path)


def aligned(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``, or a fresh copy of it where it does not start on a cache line.

    ``safetensors.torch.load_file`` hands out tensors at the file's own offsets (an int8
    weight at an address = 11 mod 64 was seen), and torch's ``_weight_int8pack_mm``
    crashed on such a weight on an AVX-512 machine while it ran on a copy (torch's
    allocator aligns to 64 bytes). Our own kernels load with unaligned instructions.
    """
    return tensor if tensor.data_ptr() % CACHE_LINE == 0 else tensor.clone()


def _load_cache(
    path: Path, linears: dict[str, nn.Linear], source: str
) -> dict[str, nn.Module] | None:
    """Rebuild the layers from a cache file; ``None`` (and a warning) if it does not fit."""
    try:
        with safe_open(str(path), "pt") as f:
            meta = f.metadata() or {}
        if meta.get("source") != source:
            raise ValueError(f"built from {meta.get('source')!r}, not {source!r}")
        kinds: dict[str, str] = json.loads(meta["kinds"])
        tensors = load_file(str(path))
        layers: dict[str, nn.Module] = {}
        for name, kind in kinds.items():
            cls = _QUANT_LAYERS[kind]
            held = (*(f"{name}.{b}" for b in cls.BUFFERS), f"{name}.bias")
            arrays = [tensors.get(key) for key in held]
            if not issubclass(cls, NativeLinear):  # torch's kernels; ours load unaligned
                arrays = [None if t is None else aligned(t) for t in arrays]
            layer = cls(*arrays)
            linear = linears[name]
            if (layer.out_features, layer.in_features) != tuple(linear.weight.shape):
                raise ValueError(f"{name}: cached shape differs from the model's")
            layers[name] = layer
    except (OSError, KeyError, ValueError, SafetensorError) as exc:
        log.warning("ignoring the cache %s: %s", path, exc)
        return None
    return layers


def _convert(
    model: nn.Module,
    mode: str,
    gguf_path: Path | None,
    cache_dir: Path | None,
    report: AccelerationReport,
    native: bool,
    requantize: bool,
) -> dict[str, nn.Module]:
    """The replacement for every ``nn.Linear`` of ``model``, from the cache if it fits."""
    linears = _linears(model)
    quantized = mode.startswith("int4")
    dtype = next(iter(linears.values())).weight.dtype if linears else torch.float32
    use_cache = cache_dir is not None and quantized and gguf_path is not None
    path = None
    q6k_form = _q6k_form(native, requantize)
    if use_cache and cache_dir:
        path = cache_path(cache_dir, mode, dtype, native, requantize, q6k_form)
    source = _source_tag(gguf_path) if use_cache and gguf_path else ""
    cached = _load_cache(path, linears, source) if path and path.is_file() else None
    if cached is not None:
        report.from_cache = True
        return {n: cached[n] if n in cached else FastLinear(m) for n, m in linears.items()}
    weights = GGUFWeights(gguf_path) if quantized and gguf_path is not None else None
    layers = {
        n: _replacement(n, m, mode, weights, report, native, requantize, q6k_form)
        for n, m in linears.items()
    }
    if path is not None:
        others = {v.q6k_form for v in kernels.VARIANTS} - {q6k_form}  # other variants' files
        siblings = [cache_path(cache_dir, mode, dtype, native, requantize, form)
                    for form in sorted(others)] if cache_dir else []
        _save_cache(path, layers, source, siblings)
    return layers


def accelerate(
    model: nn.Module,
    gguf_path: Path | None = None,
    mode: str = "fp32",
    *,
    cache_dir: Path | None = None,
    native: bool | None = None,
    requantize: bool = False,
) -> AccelerationReport:
    """Replace ``model``'s ``nn.Linear`` layers in place (see the module docstring).

    ``gguf_path``: the GGUF the model was loaded from (required by the int4 modes).
    When every linear layer then has a row-independent format (``"int4+int8"``),
    ``report.row_invariant`` is true: with :mod:`engine.cpu.forward` a k-token step gives
    bit-identical logits to k one-token steps.
    ``cache_dir``: a folder owned by this model (e.g. its converted-weights cache).
    ``native`` (default: where they run) puts the quantized weights on our own kernels
    (:class:`Q4Linear`, :class:`Q8Linear`) instead of torch's; ``requantize`` (drafts,
    native, ``"int4+int8"``) rounds the tensors with no int4 form to 4 bits as well.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    int4 = mode.startswith("int4")
    if int4 and gguf_path is None:
        raise ValueError(f"mode {mode!r} needs the GGUF file the model was loaded from")
    report = AccelerationReport(mode)
    if mode != "off":
        ours = kernels.available() if native is None else native
        if ours and not kernels.available():
            raise RuntimeError("native kernels requested but not available here")
        converted = _convert(model, mode, gguf_path, cache_dir, report, ours, requantize)
        for name, layer in converted.items():
            _set_submodule(model, name, layer)
            report.layers[formats.format_of(layer).name] += 1
        pages.to_huge_pages(m for m in converted.values() if isinstance(m, NativeLinear))
        report.row_invariant = bool(converted) and all(
            formats.format_of(m).row_independent for m in converted.values())
    report.weight_bytes = model_bytes(model)
    log.info("accelerate %s", report.summary())
    return report


def int8_layers(module: nn.Module) -> nn.Module:
    """Run every ``nn.Linear`` inside ``module`` as per-channel int8 on our kernels
    (:class:`Q8Linear`), in place, where the kernels can run it; returns ``module``."""
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear) and native_fits(child.in_features):
                setattr(parent, name, Q8Linear.from_weight(child.weight.detach(), child.bias))
    return module
