"""Model sources -> a loadable folder: GGUF files are converted once into a cache.

Loading a GGUF through transformers dequantizes every tensor on every start (a minute
or more for the Qwen pair). :func:`prepare` converts a verified GGUF once into a
safetensors folder under ``<data dir>/models/cache/`` keyed by the file's SHA-256, so
later starts read dense weights in seconds. A source is one of:

* a named model (see :mod:`engine.models.registry`), assembled and verified first;
* a local ``.gguf`` file (hashed, then converted like a named one);
* a local Hugging Face model folder (``config.json`` + weights), used as it is.
"""

import contextlib
import json
import logging
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine import paths
from engine.errors import UnknownModelError
from engine.models import registry
from engine.models.convert import convert_streaming, one_name_table, streams
from engine.models.memory import check_memory, conversion_bytes
from engine.models.registry import Progress

log = logging.getLogger(__name__)

CACHE_FORMAT = 1


@dataclass(frozen=True)
class PreparedModel:
    """A model ready to load: a folder transformers can read, plus where it came from."""

    name: str
    folder: Path
    sha256: str | None  # of the source GGUF, when there was one
    weight_bytes: int  # bytes of the dense weights on disk (what loading will occupy)
    gguf: Path | None = None  # the verified source GGUF, when there was one


def _noop(fraction: float, message: str) -> None:
    del fraction, message


def resolve_source(source: str) -> tuple[str, registry.ModelSpec | None, Path | None]:
    """Classify ``source`` as a named model or a local path; raise if it is neither."""
    if source in registry.MODELS:
        return source, registry.MODELS[source], None
    path = Path(source).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return path.stem, None, path
    if path.is_dir() and (path / "config.json").is_file():
        return path.name, None, path
    if path.exists():
        raise UnknownModelError(
            f"{source!r} is neither a .gguf file nor a model folder with config.json"
        )
    registry.get_spec(source)  # raises UnknownModelError listing the known names
    raise AssertionError("unreachable")


def _folder_weight_bytes(folder: Path) -> int:
    files = list(folder.glob("*.safetensors")) or list(folder.glob("*.bin"))
    return sum(f.stat().st_size for f in files)


def prepare(
    source: str, data_dir: str | os.PathLike[str] | None = None, progress: Progress | None = None
) -> PreparedModel:
    """Return a loadable folder for ``source``, converting a GGUF the first time."""
    progress = progress or _noop
    name, spec, path = resolve_source(source)
    if path is not None and path.is_dir():
        return PreparedModel(name, path, None, _folder_weight_bytes(path))
    models = paths.models_dir(data_dir)
    if spec is not None:
        gguf_file = registry.assemble(spec, models, progress)
        sha = spec.sha256
    else:
        assert path is not None
        gguf_file = path
        sha = registry.sha256_file(path, progress)
    cache = models / "cache" / f"{name}-{sha[:16]}"
    if not _cache_valid(cache, sha):
        check_memory(conversion_bytes(gguf_file), f"converting {name}")
        convert(gguf_file, cache, sha, progress)
    progress(1.0, f"{name} ready")
    return PreparedModel(name, cache, sha, _folder_weight_bytes(cache), gguf_file)


def _cache_valid(cache: Path, sha: str) -> bool:
    """A cache is used only if its manifest names the verified source and all files match."""
    manifest = cache / "manifest.json"
    if not manifest.is_file():
        return False
    try:
        meta = json.loads(manifest.read_text())
        files: dict[str, int] = meta["files"]
        ok = meta["format"] == CACHE_FORMAT and meta["source_sha256"] == sha
    except (ValueError, KeyError, TypeError):
        log.warning("ignoring unreadable cache manifest %s", manifest)
        return False
    for fname, size in files.items():
        f = cache / fname
        if not f.is_file() or f.stat().st_size != size:
            log.warning("cache file %s is missing or has the wrong size; converting again", f)
            return False
    return ok


@contextlib.contextmanager
def _tensor_progress(progress: Progress) -> Iterator[None]:
    """Report transformers' per-tensor GGUF dequantization as progress 0.1..0.9."""
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    original = getattr(gguf_utils, "tqdm", None)

    def reporting(items: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
        del args, kwargs
        items = list(items)
        for i, item in enumerate(items):
            fraction = 0.1 + 0.8 * i / max(len(items), 1)
            progress(fraction, f"dequantizing tensor {i + 1}/{len(items)}")
            yield item

    if original is not None:
        gguf_utils.tqdm = reporting  # type: ignore[attr-defined]
    try:
        yield
    finally:
        if original is not None:
            gguf_utils.tqdm = original  # type: ignore[attr-defined]


def convert(gguf_file: Path, cache: Path, sha: str, progress: Progress) -> None:
    """Dequantize ``gguf_file`` into float32 safetensors in ``cache``: tensor by tensor
    (:mod:`engine.models.convert`) for Llama and Qwen2 files, else through transformers."""
    log.info("converting %s into %s", gguf_file, cache)
    tmp = cache.with_name(cache.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    if streams(gguf_file):
        convert_streaming(gguf_file, tmp, progress)
    else:
        convert_with_transformers(gguf_file, tmp, progress)
    files = {f.name: f.stat().st_size for f in tmp.iterdir() if f.is_file()}
    manifest = {
        "format": CACHE_FORMAT,
        "source": gguf_file.name,
        "source_sha256": sha,
        "dtype": "float32",
        "files": files,
    }
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2))
    shutil.rmtree(cache, ignore_errors=True)
    os.replace(tmp, cache)


def convert_with_transformers(gguf_file: Path, tmp: Path, progress: Progress) -> None:
    """transformers' own way into the folder ``tmp``: every dense tensor and the model in
    memory at once (the reference :mod:`engine.models.convert` is tested against)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    progress(0.02, f"reading the tokenizer of {gguf_file.name}")
    tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    progress(0.08, f"reading {gguf_file.name}")
    with _tensor_progress(progress), one_name_table():
        model = AutoModelForCausalLM.from_pretrained(
            gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32
        )
    progress(0.92, "saving the converted weights")
    # A GGUF-loaded model refuses to serialise while it still claims to be quantized.
    model.hf_quantizer = None  # type: ignore[assignment]
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)

