"""Converting a GGUF tensor by tensor gives exactly what transformers' own conversion gives.

The light model's GGUF (SmolLM2 135M, Llama) goes both ways: through ``engine.models.cache``'s
conversion, which streams it (``engine.models.convert``), and through transformers, which holds
every dense tensor at once. Every file and every tensor must be the same.
"""

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open

from engine.models import cache
from engine.models.convert import one_name_table, safetensors_header, streams
from tests.foreign_support import light_gguf


def test_the_light_model_converts_tensor_by_tensor_exactly_as_transformers_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gguf = light_gguf()
    assert streams(gguf)
    reference = tmp_path / "transformers"
    cache.convert_with_transformers(gguf, reference, lambda fraction, message: None)
    monkeypatch.setattr(cache, "convert_with_transformers", pytest.fail)
    seen: list[float] = []
    ours = tmp_path / "cache"
    cache.convert(gguf, ours, "0" * 64, lambda fraction, message: seen.append(fraction))
    assert seen == sorted(seen) and seen[0] > 0 and seen[-1] < 1
    names = {p.name for p in reference.iterdir()}
    assert {p.name for p in ours.iterdir()} == names | {"manifest.json"}
    for name in names - {"model.safetensors"}:
        if name.endswith(".json"):
            assert json.loads((ours / name).read_text()) == json.loads(
                (reference / name).read_text())
        else:
            assert (ours / name).read_bytes() == (reference / name).read_bytes()
    with safe_open(ours / "model.safetensors", "np") as a, \
            safe_open(reference / "model.safetensors", "np") as b:
        assert set(a.keys()) == set(b.keys())
        for key in a.keys():  # noqa: SIM118 (safe_open is not a mapping)
            assert np.array_equal(a.get_tensor(key), b.get_tensor(key)), key


def test_the_safetensors_header_lays_tensors_end_to_end_padded_to_8_bytes() -> None:
    header = safetensors_header([("a", (2, 3)), ("b", (5,))])
    size = int.from_bytes(header[:8], "little")
    assert size == len(header) - 8 and size % 8 == 0
    described = json.loads(header[8:])
    assert described["a"] == {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}
    assert described["b"] == {"dtype": "F32", "shape": [5], "data_offsets": [24, 44]}


def test_the_name_table_is_built_once_inside_the_block_and_restored_after_it() -> None:
    import gguf

    built = gguf.get_tensor_name_map
    arch = next(iter(gguf.MODEL_ARCH_NAMES))
    with pytest.raises(RuntimeError), one_name_table():
        assert gguf.get_tensor_name_map(arch, 2) is gguf.get_tensor_name_map(arch, 2)
        assert gguf.get_tensor_name_map(arch, 3) is not gguf.get_tensor_name_map(arch, 2)
        raise RuntimeError
    assert gguf.get_tensor_name_map is built
    assert built(arch, 2) is not built(arch, 2)
