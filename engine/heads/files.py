"""Head files: safetensors weights plus metadata naming the target they were trained for.

Contract: :func:`save_head` writes the head's weights (``float16`` by default) and
:class:`HeadInfo` as safetensors metadata. :func:`load_head` reads them back as a
``float32`` :class:`~engine.heads.model.EagleHead` and raises
:class:`~engine.errors.HeadFileError` for an unreadable or malformed file and
:class:`~engine.errors.IncompatibleModelsError` for a head trained for another target
(different name, weights SHA-256, hidden size or vocabulary). :func:`find_head` looks for
a target's head in the data directory (heads the office trained) and then in
``assets/heads/`` (shipped heads).
"""

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from engine import paths
from engine.errors import HeadFileError, IncompatibleModelsError
from engine.heads.model import EagleHead, HeadConfig
from engine.paths import ASSETS

FORMAT = "anve-eagle-head/1"
SHIPPED = ASSETS / "heads"


@dataclass(frozen=True)
class HeadInfo:
    """What a head file says about itself."""

    target: str  # the target model's name
    target_sha256: str | None  # SHA-256 of the target's weights (its GGUF), if known
    vocab_size: int
    config: HeadConfig
    corpus_tokens: int = 0
    held_out_acceptance: float | None = None  # top-1 agreement with the target, held out
    extra: dict[str, Any] = field(default_factory=dict)  # training details

    def metadata(self) -> dict[str, str]:
        meta = asdict(self)
        meta["config"] = self.config.to_dict()
        return {"format": FORMAT, "info": json.dumps(meta, sort_keys=True)}


def head_file_name(target: str) -> str:
    return f"{target}.safetensors"


def save_head(
    head: EagleHead, info: HeadInfo, path: Path, dtype: torch.dtype = torch.float16
) -> Path:
    """Write ``head`` and ``info`` to ``path`` atomically (write then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to(dtype).contiguous() for k, v in head.state_dict().items()}
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, tmp, metadata=info.metadata())
    os.replace(tmp, path)
    return path


def read_info(path: Path) -> HeadInfo:
    """The metadata of a head file; :class:`HeadFileError` if it is not a readable head."""
    try:
        with safe_open(path, framework="pt") as f:
            meta = f.metadata() or {}
        if meta.get("format") != FORMAT:
            raise HeadFileError(f"{path} is not an ANVE draft head (format {meta.get('format')!r})")
        raw = json.loads(meta["info"])
        raw["config"] = HeadConfig(**raw["config"])
        return HeadInfo(**raw)
    except (SafetensorError, OSError, KeyError, TypeError, ValueError) as exc:
        raise HeadFileError(
            f"cannot read the draft head {path}: {exc}; delete it or retrain it with "
            "python -m engine.heads.train"
        ) from exc


def check_target(info: HeadInfo, path: Path, name: str, sha256: str | None, model: Any) -> None:
    """Raise :class:`IncompatibleModelsError` unless the head was made for this target."""
    vocab = int(model.get_input_embeddings().num_embeddings)
    problems = []
    if info.target != name:
        problems.append(f"it was trained for {info.target!r}")
    if info.target_sha256 and sha256 and info.target_sha256 != sha256:
        problems.append(
            f"its target weights had SHA-256 {info.target_sha256[:12]}…, not {sha256[:12]}…"
        )
    if info.config.hidden_size != int(model.config.hidden_size) or info.vocab_size != vocab:
        problems.append("its hidden size or vocabulary differs from the target's")
    if problems:
        raise IncompatibleModelsError(
            f"the draft head {path} cannot draft for {name!r}: {'; '.join(problems)}; "
            f"train one with python -m engine.heads.train --target {name}"
        )


def load_head(path: Path, name: str, sha256: str | None, model: Any) -> tuple[EagleHead, HeadInfo]:
    """Load a head for the target ``model`` called ``name``; checks as described above."""
    info = read_info(path)
    check_target(info, path, name, sha256, model)
    head = EagleHead(info.config)
    try:
        with safe_open(path, framework="pt") as f:
            state = {k: f.get_tensor(k).float() for k in f.keys()}  # noqa: SIM118
        head.load_state_dict(state)
    except (SafetensorError, OSError, RuntimeError) as exc:
        raise HeadFileError(
            f"the draft head {path} is damaged ({exc}); retrain or reinstall it"
        ) from exc
    return head.float().eval(), info


def find_head(name: str, data_dir: str | os.PathLike[str] | None = None) -> Path | None:
    """The head file for target ``name``: the office's own first, then the shipped one."""
    for folder in (paths.data_dir(data_dir) / "heads", SHIPPED):
        candidate = folder / head_file_name(name)
        if candidate.is_file():
            return candidate
    return None
