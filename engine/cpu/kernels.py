"""Our native integer-dot kernels (``engine/cpu/csrc/qdot.cpp``): built once, loaded with ctypes.

Contract: :func:`available` says whether the kernels run here (an x86 CPU with AVX2,
FMA and F16C, and a C++ compiler the first time). :class:`Layers` computes one or more
linear layers that read the same input in one call, each in its own form (:data:`FORMS`):
q4 (4-bit codes, float16 scale and offset per 32) and q8 (per-channel int8) with the
activations rounded to int8 per group of 32; q4k and q6k (Q4_K and Q6_K in their own
integer form; q6kp the same Q6_K weights with 6-bit codes) with them rounded per 256
inputs, as llama.cpp. Each output row is
bit-identical whatever the number of rows or layers in the call (see the C++ file).
When the kernels cannot run, the caller keeps torch's own kernels; nothing else changes.
:func:`row_attention` computes attention for a few query rows over the KV cache, each row
over its own causal prefix and independent of the others, without a Python call per row.
:func:`decoder_step` runs a whole Llama/Qwen2 step of new tokens (any number of causal
rows, at most :data:`MAX_TREE` with a tree) through every layer (:class:`DecoderModel`)
in one call (:mod:`engine.cpu.forward` builds it). Both take an optional draft tree
(:func:`tree_masks`): each row then attends to the cache before the step and to its own
ancestors among the new rows only. :func:`decoder_step_seqs` runs rows of several
sequences (batched decoding), each over its own sequence's cache, each row bit for bit
what a one-row step of its sequence gives.

Variants (:data:`VARIANTS`): the same source compiled for AVX2 (``avx2``), AVX-VNNI
(``avxvnni``), AVX-512 F/BW/VL/VNNI (``avx512``) and AVX-512 with AMX-INT8 tiles
(``amx``: q4k calls of 32 rows or more take their exact sums from tiles and return the
``avx512`` bits; the library asks the OS for tile data once when it loads, and is not
used where that is refused). The run picks the best
one this CPU has (``/proc/cpuinfo``) and the compiler can build (a variant it cannot
build is skipped, logged); ``ANVE_KERNELS=<name>`` forces one, and forcing one the CPU or
the compiler lacks raises :class:`VariantError` (never runs an instruction the CPU lacks).
The environment is read once (again after :func:`reset`).
:func:`use` switches the variant inside one process (tests, A/B measurements);
:func:`variant` names the one running. Every variant keeps the row promise above on
its own; different variants may differ in the last bits of a sum (their integer sums
are all exact; only the floating-point order may differ).

The shared library is compiled with the system ``c++`` into the user cache folder
(``~/.cache/anve/kernels``, or ``ANVE_KERNEL_DIR``), one file per variant named by a
hash of the source and flags, so each is built once per source version (a few
seconds). ``ANVE_NATIVE=0`` turns the kernels off.
"""

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import platformdirs
import torch

from engine.cpu import formats

log = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "csrc" / "qdot.cpp"
BASE_FLAGS = ("-O3", "-fopenmp", "-shared", "-fPIC", "-std=c++17",
              "-ffp-contract=off",  # a * b + c rounds twice, as torch's elementwise ops do
              *formats.c_defines())  # the weight formats' ids (engine.cpu.formats)
GROUP = 32  # activations and q4 weights are grouped by 32 input features
MAX_TREE = 31  # rows of a draft tree one call attends over (one bit each in an int32)
_P, _I = ctypes.c_void_p, ctypes.c_int


class VariantError(RuntimeError):
    """A forced kernel variant (``ANVE_KERNELS`` or :func:`use`) that cannot run here."""


@dataclass(frozen=True)
class Variant:
    """One build of the kernels: its compiler flags and the CPU flags it needs."""

    name: str
    flags: tuple[str, ...]  # beyond BASE_FLAGS
    cpu: frozenset[str]  # /proc/cpuinfo flags the code uses
    q6k_form: str = "q6k"  # the form Q6_K tensors load in (see :func:`q6k_form`)

    @property
    def all_flags(self) -> tuple[str, ...]:
        return (*BASE_FLAGS, *self.flags)


_AVX2 = ("-mavx2", "-mfma", "-mf16c")
_AVX2_CPU = frozenset({"avx2", "fma", "f16c"})
_AVX512 = (*_AVX2, "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni")
_AVX512_CPU = _AVX2_CPU | {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"}
VARIANTS = (  # worst first: the last one the CPU and compiler support runs
    Variant("avx2", _AVX2, _AVX2_CPU),
    Variant("avxvnni", (*_AVX2, "-mavxvnni"), _AVX2_CPU | {"avx_vnni"}),
    Variant("avx512", _AVX512, _AVX512_CPU, q6k_form="q6kp"),
    Variant("amx", (*_AVX512, "-mamx-tile", "-mamx-int8"),
            _AVX512_CPU | {"amx_tile", "amx_int8"}, q6k_form="q6kp"),
)
BY_NAME = {v.name: v for v in VARIANTS}
FLAGS = VARIANTS[0].all_flags  # the baseline build's flags
CPU_FLAGS = VARIANTS[0].cpu


@functools.cache
def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags (Linux /proc/cpuinfo; empty where unreadable)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def cpu_supports(name: str = "avx2") -> bool:
    """Whether this CPU has the instructions variant ``name`` uses."""
    return cpu_flags() >= BY_NAME[name].cpu


def _compiler() -> str | None:
    return shutil.which("c++") or shutil.which("g++")


@functools.cache
def compiler_accepts(flags: tuple[str, ...]) -> bool:
    """Whether the system compiler takes these flags (an empty translation unit)."""
    compiler = _compiler()
    if compiler is None:
        return False
    result = subprocess.run([compiler, *flags, "-x", "c++", "-fsyntax-only", "-"], input="",
                            capture_output=True, text=True, check=False)
    return result.returncode == 0


def supported() -> list[str]:
    """The variants this CPU runs, worst first (whether the compiler builds them aside)."""
    return [v.name for v in VARIANTS if cpu_supports(v.name)]


def kernel_dir() -> Path:
    chosen = os.environ.get("ANVE_KERNEL_DIR")
    return Path(chosen) if chosen else Path(platformdirs.user_cache_dir("anve")) / "kernels"


def library_path(name: str = "avx2") -> Path:
    """Where the library of variant ``name`` for this source lives once built."""
    flags = BY_NAME[name].all_flags
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(flags).encode()).hexdigest()[:16]
    return kernel_dir() / f"qdot-{name}-{digest}.so"


def build(path: Path, name: str = "avx2") -> None:
    """Compile variant ``name`` into ``path`` (atomically); ``RuntimeError`` on failure."""
    compiler = _compiler()
    if compiler is None:
        raise RuntimeError("no C++ compiler (install g++ for the fast kernels)")
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        out = Path(tmp) / path.name
        result = subprocess.run(
            [compiler, *BY_NAME[name].all_flags, "-o", str(out), str(SOURCE)],
            capture_output=True, text=True, check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"compiling {SOURCE.name} failed: {result.stderr.strip()[-800:]}")
        os.replace(out, path)


class Part(ctypes.Structure):
    """One layer of an ``anve_linear_parts`` call (the C ``Part``)."""

    _fields_ = [("form", ctypes.c_int), ("n", ctypes.c_int), ("w", ctypes.c_void_p * 5),
                ("bias", ctypes.c_void_p), ("y", ctypes.c_void_p)]


class DecoderLayer(ctypes.Structure):
    """One layer of an ``anve_decoder_step`` call: its weights and KV cache buffers."""

    _fields_ = [("norm1", _P), ("norm2", _P), ("qkv", Part * 3), ("o", Part),
                ("gate_up", Part * 2), ("down", Part), ("kbuf", _P), ("vbuf", _P),
                ("head_stride", ctypes.c_int64)]


class DecoderModel(ctypes.Structure):
    """The shapes and layers of an ``anve_decoder_step`` call."""

    _fields_ = [("n_layers", _I), ("hidden", _I), ("heads", _I), ("kv_heads", _I),
                ("head_dim", _I), ("inter", _I), ("eps", ctypes.c_float),
                ("scaling", ctypes.c_float), ("layers", ctypes.POINTER(DecoderLayer))]


FORMS = formats.C_IDS  # format name -> id in the C Part
PartSpec = tuple[str, tuple[torch.Tensor, ...], torch.Tensor | None]  # form, weights, bias


def _arrays(parts: list[PartSpec]) -> list[torch.Tensor | None]:
    """Every array the parts point into, in order (bias included, None when absent)."""
    return [t for _, weights, bias in parts for t in (*weights, bias)]


def _bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    lib.anve_linear_parts.argtypes = [_P, _I, _I, _I, ctypes.POINTER(Part)]
    lib.anve_linear_parts.restype = None
    lib.anve_row_attention.argtypes = [_P, _P, _P, _P, _I, _I, _I, _I, _I, ctypes.c_int64,
                                       ctypes.c_float, _P]
    lib.anve_row_attention.restype = None
    lib.anve_decoder_step.argtypes = [ctypes.POINTER(DecoderModel), _P, _I, _I, _P, _P, _P]
    lib.anve_decoder_step.restype = None
    lib.anve_decoder_step_seqs.argtypes = [ctypes.POINTER(DecoderModel), _P, _I, _P, _P, _P, _P,
                                           _P, _P, _P]
    lib.anve_decoder_step_seqs.restype = None
    lib.anve_qdot_variant.restype = ctypes.c_char_p
    lib.anve_qdot_max_rows.restype = _I
    lib.anve_qdot_ready.restype = _I
    return lib


_forced: list[str | None] = [None]  # set by use(); None: ANVE_KERNELS or the best


def use(name: str | None) -> None:
    """Run variant ``name`` from now on in this process (``None``: back to the choice of
    ``ANVE_KERNELS`` or the best one); raises :class:`VariantError` where it cannot run."""
    if name is not None:
        _check(name)
        if load(name) is None:
            raise VariantError(f"kernel variant {name!r} could not be built or loaded "
                               "(see the log)")
    _forced[0] = name
    _now.clear()


def why_not(name: str) -> str | None:
    """Why variant ``name`` cannot run here (unknown, CPU flags missing, a compiler that
    does not take its flags), or ``None`` where it can (a failed build aside)."""
    if name not in BY_NAME:
        return f"unknown kernel variant {name!r} (one of {', '.join(BY_NAME)})"
    missing = sorted(BY_NAME[name].cpu - cpu_flags())
    if missing:
        return (f"kernel variant {name!r} needs CPU flags this CPU lacks: {', '.join(missing)}"
                f" (it runs: {', '.join(supported()) or 'none'})")
    if _compiler() is not None and not compiler_accepts(BY_NAME[name].flags):
        return (f"kernel variant {name!r}: the C++ compiler does not take "
                f"{' '.join(BY_NAME[name].flags)}")
    return None


def _check(name: str) -> None:
    reason = why_not(name)
    if reason is not None:
        raise VariantError(reason)


def buildable() -> list[str]:
    """The variants this CPU runs and the compiler takes the flags of, worst first (the
    others logged); all the CPU runs when there is no compiler (prebuilt files)."""
    names = []
    for name in supported():
        if _compiler() is not None and not compiler_accepts(BY_NAME[name].flags):
            log.info("kernel variant %s skipped: the compiler does not take %s", name,
                     " ".join(BY_NAME[name].flags))
            continue
        names.append(name)
    return names


@functools.cache
def load(name: str) -> ctypes.CDLL | None:
    """Variant ``name``'s library, built if need be, or ``None`` (logged) on failure."""
    path = library_path(name)
    try:
        if not path.is_file():
            log.info("building the native kernels (%s) into %s", name, path)
            build(path, name)
        lib = _bind(ctypes.CDLL(str(path)))
    except (OSError, RuntimeError) as exc:
        log.warning("native kernels (%s) unavailable, using torch's: %s", name, exc)
        return None
    built = lib.anve_qdot_variant().decode()
    if built != name:  # flags that did not select the code they should have
        log.warning("native kernels: %s was built as %s; not used", path.name, built)
        return None
    if not lib.anve_qdot_ready():  # amx: the OS refused tile data (arch_prctl)
        log.warning("native kernels (%s): the operating system does not let this process "
                    "use AMX tile data; not used", name)
        return None
    return lib


@functools.cache
def _resolve(native: str, env: str, forced: str | None) -> tuple[str, ctypes.CDLL] | None:
    """The variant that runs and its library for these settings (see :func:`chosen`)."""
    if native == "0":
        log.info("native kernels off (ANVE_NATIVE=0)")
        return None
    wanted = forced or env.strip().lower() or None
    if wanted is not None:
        _check(wanted)
        lib = load(wanted)
        return None if lib is None else (wanted, lib)
    if not cpu_supports():
        log.info("native kernels need AVX2, FMA and F16C; using torch's kernels")
        return None
    for name in reversed(buildable()):  # the best first; a failed build falls back
        lib = load(name)
        if lib is not None:
            log.info("native kernels: %s (this CPU runs %s)", name, ", ".join(supported()))
            return name, lib
    return None


_now: dict[str, tuple[str, ctypes.CDLL] | None] = {}  # the resolved choice, once per setting


def _current() -> tuple[str, ctypes.CDLL] | None:
    """The running variant and library: the environment is read on the first call after
    :func:`use` or :func:`reset` (every kernel call asks; an environment read costs µs)."""
    try:
        return _now["current"]
    except KeyError:
        pass
    current = _resolve(os.environ.get("ANVE_NATIVE", "1"), os.environ.get("ANVE_KERNELS", ""),
                       _forced[0])
    _now["current"] = current
    return current


def library() -> ctypes.CDLL | None:
    """The loaded kernels of the variant that runs, or ``None`` (logged once) where they
    cannot run; raises :class:`VariantError` where a forced variant cannot run here."""
    current = _current()
    return None if current is None else current[1]


def variant() -> str | None:
    """The name of the variant that runs (``avx2``, ``avxvnni``, ``avx512``, ``amx``), or
    ``None``."""
    current = _current()
    return None if current is None else current[0]


def reset() -> None:
    """Forget every choice, check and loaded library (tests change the environment)."""
    _forced[0] = None
    _now.clear()
    _resolve.cache_clear()
    load.cache_clear()
    compiler_accepts.cache_clear()


def q6k_form() -> str:
    """The form a Q6_K tensor loads in for the variant that runs: ``q6kp`` (codes in 6
    bits) where the 512-bit loop unpacks them for less than the memory they save, else
    ``q6k`` (a byte a code: the 256-bit loops run it faster, docs/kernels.md). Every
    variant runs both forms, with the same bits."""
    name = variant()
    return "q6k" if name is None else BY_NAME[name].q6k_form


def max_rows() -> int:
    """Rows one pass over the weights holds in the running variant (0 when none runs)."""
    lib = library()
    return 0 if lib is None else int(lib.anve_qdot_max_rows())


def available() -> bool:
    return library() is not None


def report() -> dict[str, object]:
    """What runs, as the worker's ``/health`` and the benchmark say it: the variant
    (``None``: torch's kernels), the rows one pass over the weights holds, and whether
    the variant was forced (``ANVE_KERNELS`` or :func:`use`) rather than chosen."""
    forced = bool(os.environ.get("ANVE_KERNELS", "").strip()) or _forced[0] is not None
    return {"variant": variant(), "rows_per_pass": max_rows(), "forced": forced}


def _library_or_raise() -> ctypes.CDLL:
    lib = library()
    if lib is None:
        raise RuntimeError("the native kernels are not available")
    return lib


class Layers:
    """Quantized layers that read the same input, computed by one native call.

    ``parts`` are ``(form, weights, bias)`` with ``form`` one of :data:`FORMS` and
    ``weights`` the layer's arrays, ``[N, ...]`` first; the C structs are built once
    (:meth:`same` tells whether they still point at a layer's current arrays). Calling
    with ``x [..., K]`` returns each layer's float32 ``[..., N]``.
    """

    def __init__(self, in_features: int, parts: list[PartSpec]) -> None:
        self.k = in_features
        self.arrays = _arrays(parts)  # kept alive, compared by identity
        self.sizes = [int(w[0].shape[0]) for _, w, _ in parts]
        self.structs = (Part * len(parts))()
        for struct, (form, weights, bias) in zip(self.structs, parts, strict=True):
            struct.form, struct.n = FORMS[form], int(weights[0].shape[0])
            for i, w in enumerate(weights):
                struct.w[i] = w.data_ptr()
            struct.bias = None if bias is None else bias.data_ptr()

    def same(self, parts: list[PartSpec]) -> bool:
        """Whether ``parts`` hold the very arrays these structs were built from."""
        now = _arrays(parts)
        return len(now) == len(self.arrays) and all(
            a is b for a, b in zip(now, self.arrays, strict=True))

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        lib = _library_or_raise()
        if x.dtype != torch.float32 or not x.is_contiguous():
            x = x.to(torch.float32).contiguous()
        lead = x.shape[:-1]
        outs = [torch.empty((*lead, n), dtype=torch.float32) for n in self.sizes]  # [..., N]
        for struct, y in zip(self.structs, outs, strict=True):
            struct.y = y.data_ptr()
        lib.anve_linear_parts(x.data_ptr(), x.numel() // self.k, self.k, len(outs),
                              self.structs)
        return outs


def _cache_view(t: torch.Tensor) -> torch.Tensor:
    """``t [1, Hkv, L, Dh]`` with positions ``Dh`` apart and unit steps inside a row."""
    if t.stride(-1) == 1 and t.stride(-2) == t.shape[-1]:
        return t
    return t.contiguous()


def tree_masks(parents: Sequence[int]) -> torch.Tensor:
    """Per row of a draft tree, the bits of the rows it sees (its ancestors and itself):
    ``parents[i]`` is row ``i``'s parent row, ``-1`` for none, always below ``i``.

    Example: ``[-1, 0, 0, 1]`` (rows 1 and 2 children of 0, row 3 of 1) -> ``[1, 3, 5, 11]``.
    """
    if len(parents) > MAX_TREE:
        raise ValueError(f"a tree holds at most {MAX_TREE} rows, not {len(parents)}")
    masks: list[int] = []
    for i, parent in enumerate(parents):
        if not -1 <= parent < i:
            raise ValueError(f"row {i}'s parent must be -1 or an earlier row, not {parent}")
        masks.append((masks[parent] if parent >= 0 else 0) | 1 << i)
    return torch.tensor(masks, dtype=torch.int32)  # [T], bit patterns (bit 30 at most)


def tree_depths(parents: Sequence[int]) -> list[int]:
    """Each row's distance from a row without parent (as :func:`tree_masks`, parents
    first): ``[-1, 0, 0, 1]`` -> ``[0, 1, 1, 2]``."""
    depths: list[int] = []
    for parent in parents:
        depths.append(depths[parent] + 1 if parent >= 0 else 0)
    return depths


def _mask_pointer(tree: torch.Tensor | None, rows: int) -> int | None:
    if tree is None:
        return None
    if tree.dtype != torch.int32 or tree.shape != (rows,) or not tree.is_contiguous():
        raise ValueError(f"tree masks must be a contiguous int32 [{rows}] tensor")
    return tree.data_ptr()


def row_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  scaling: float, tree: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of ``q [1, H, T, Dh]`` (the last ``T`` positions) over the cache
    ``k``, ``v [1, Hkv, L, Dh]``, all float32; returns ``[1, T, H, Dh]``. Row ``t`` sees
    positions ``0 .. L - T + t``, or with ``tree`` (:func:`tree_masks`) the cache before
    the ``T`` rows and the rows its mask names; ``Dh`` must be a multiple of 8."""
    lib = _library_or_raise()
    _, h, t, dh = q.shape
    mask = _mask_pointer(tree, t)
    hkv, length = k.shape[1], k.shape[2]
    q = q.contiguous()
    k, v = _cache_view(k), _cache_view(v)
    if k.stride(1) != v.stride(1):
        k, v = k.contiguous(), v.contiguous()
    out = torch.empty(1, t, h, dh, dtype=torch.float32)
    lib.anve_row_attention(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), h, hkv,
                           t, length, dh, k.stride(1), scaling, mask)
    return out


def decoder_step(model: DecoderModel, x: torch.Tensor, start: int, cos: torch.Tensor,
                 sin: torch.Tensor, tree: torch.Tensor | None = None) -> None:
    """Run ``x [1, T, H]`` (float32, contiguous, updated in place) through every layer of
    ``model`` for new positions ``start ..``, given their rotary ``cos``, ``sin [1, T, Dh]``
    (contiguous); each layer's ``kbuf``/``vbuf`` must have room for ``start + T``. With
    ``tree`` (:func:`tree_masks`) the rows are a draft tree's, attending as it says."""
    mask = _mask_pointer(tree, x.shape[1])
    _library_or_raise().anve_decoder_step(ctypes.byref(model), x.data_ptr(), x.shape[1], start,
                                          cos.data_ptr(), sin.data_ptr(), mask)


def decoder_step_seqs(model: DecoderModel, x: torch.Tensor, seq: torch.Tensor,
                      pos: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                      keys: torch.Tensor, values: torch.Tensor, strides: torch.Tensor) -> None:
    """Rows of several sequences through every layer, ``x [T, H]`` (float32, contiguous,
    updated in place): row ``t`` of sequence ``seq[t]`` at its position ``pos[t]`` (int32
    ``[T]`` each), with its rotary ``cos``, ``sin [T, Dh]``. ``keys``, ``values`` and
    ``strides`` (int64 ``[S * layers]``, sequence-major) give each sequence's layers' cache
    buffers ``[Hkv, capacity, Dh]`` (their addresses, with room for the new rows) and their
    head strides. A sequence's rows sit at consecutive positions in order; each row gets
    what a one-row :func:`decoder_step` of its sequence gives it."""
    t = x.shape[0]
    ints = (seq, pos)
    if x.dtype != torch.float32 or x.dim() != 2 or not x.is_contiguous() or any(
            a.dtype != torch.int32 or a.shape != (t,) or not a.is_contiguous() for a in ints):
        raise ValueError("x must be contiguous float32 [T, H], seq and pos int32 [T]")
    if any(a.dtype != torch.int64 or a.shape != keys.shape for a in (values, strides)):
        raise ValueError("keys, values and strides must be int64 of one shape")
    _library_or_raise().anve_decoder_step_seqs(
        ctypes.byref(model), x.data_ptr(), t, seq.data_ptr(), pos.data_ptr(), cos.data_ptr(),
        sin.data_ptr(), keys.data_ptr(), values.data_ptr(), strides.data_ptr())


def main() -> int:
    """``python -m engine.cpu.kernels``: build every variant this CPU runs and say which runs."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        name = variant()
    except VariantError as exc:
        log.error("native kernels: %s", exc)
        return 2
    if name is None:
        log.warning("native kernels: not available here (torch's kernels will be used)")
        return 1
    for other in buildable() if os.environ.get("ANVE_KERNELS") is None else []:
        if load(other) is not None:  # built now, so forcing one later costs no build
            log.info("native kernels: %s ready (%s)", other, library_path(other))
    log.info("native kernels: %s runs", name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
