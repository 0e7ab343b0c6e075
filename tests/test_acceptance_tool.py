"""``python -m engine.tools.acceptance``: heads measured on the target's benchmark answers."""

import json
from pathlib import Path

import pytest
import torch

from engine.heads import train
from engine.heads.files import HeadInfo, save_head
from engine.heads.model import EagleHead, HeadConfig, feature_layers_for
from engine.tools import acceptance
from tests.tiny import save_tiny

PROMPTS = {"prompts": [
    {"kind": "code completion", "prompt": "def add(a, b):"},
    {"kind": "free chat", "prompt": "Hello, how are you?"},
    {"kind": "free chat", "prompt": "A second chat prompt, not asked at one per kind."},
]}


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved four-layer tiny Llama (deep enough for fused features), sharp enough to end
    its answers at different lengths."""
    return save_tiny(tmp_path_factory.mktemp("deep") / "tiny-deep", layers=4, scale=4.0,
                     max_positions=512)


def write_head(path: Path, loaded: object, layers: tuple[int, ...], seed: int) -> Path:
    model = loaded.model  # type: ignore[attr-defined]
    torch.manual_seed(seed)
    head = EagleHead(HeadConfig.for_target(model.config, 32, layers, fuse_rank=8))
    with torch.no_grad():
        for p in head.parameters():
            p.mul_(4.0)
    info = HeadInfo(loaded.name, loaded.sha256,  # type: ignore[attr-defined]
                    int(model.config.vocab_size), head.config)
    return save_head(head, info, path, dtype=torch.float32)


def test_heads_are_measured_on_the_answers_rows_and_the_answers_are_kept(
        target: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    loaded = train.load_target(str(target), None, "auto")
    layers = feature_layers_for(4)
    one = write_head(tmp_path / "one.safetensors", loaded, (), seed=1)
    three = write_head(tmp_path / "three.safetensors", loaded, layers, seed=2)
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps(PROMPTS))
    kept, out = tmp_path / "answers.json", tmp_path / "figures.json"

    def command(*more: str, max_tokens: int = 10) -> list[str]:
        return ["--target", str(target), "--prompts", str(prompts), "--per-kind", "1",
                "--max-tokens", str(max_tokens), "--steps", "3", "--answers", str(kept), *more]

    assert acceptance.main(command("--head", str(one), "--head", str(three),
                                   "--json", str(out))) == 0
    assert "| in its top 2 | in its top 4 |" in capsys.readouterr().out
    figures = json.loads(out.read_text())
    saved = json.loads(kept.read_text())
    assert [a["kind"] for a in saved["answers"]] == ["code completion", "free chat"]
    lengths = [len(a["answer"]) for a in saved["answers"]]
    assert all(1 <= n <= 10 for n in lengths)
    for head in figures["heads"]:
        assert set(head) == {"file", "code completion", "free chat", "overall"}
        overall = head["overall"]
        # one first draft per answer token, one chain per answer row with steps to spare
        assert overall["positions"] == sum(lengths)
        assert overall["chains"] == sum(max(0, n - 3) for n in lengths)
        assert overall["hits"] == head["code completion"]["hits"] + head["free chat"]["hits"]
        assert 0.0 <= overall["acceptance"] <= 1.0 and 0.0 <= overall["chain"] <= 3.0
        assert overall["acceptance"] <= overall["within_2"] <= overall["within_4"] <= 1.0

    # the EAGLE-1 head reads the final state alone, measured with or without the other
    def fail(*_: object) -> None:
        raise AssertionError("the kept answers were not reused")

    monkeypatch.setattr(acceptance, "target_answers", fail)
    alone = tmp_path / "alone.json"
    assert acceptance.main(command("--head", str(one), "--json", str(alone))) == 0
    assert json.loads(alone.read_text())["heads"][0] == figures["heads"][0]
    with pytest.raises(AssertionError, match="not reused"):  # another limit: answered anew
        acceptance.main(command("--head", str(one), max_tokens=9))


def test_the_heads_figures_are_what_held_out_counts_on_each_answer(target: Path,
                                                                  tmp_path: Path) -> None:
    loaded = train.load_target(str(target), None, "auto")
    head_path = write_head(tmp_path / "three.safetensors", loaded, feature_layers_for(4), 3)
    head = acceptance.load_head(head_path, loaded.name, loaded.sha256, loaded.model)[0]
    answered = acceptance.target_answers(loaded, PROMPTS["prompts"][:2], 8)
    found = acceptance.measure(loaded, [head], answered, steps=2)[0]
    embed = loaded.model.get_input_embeddings()
    lm_head = loaded.model.get_output_embeddings()
    for a in answered:
        ids = torch.tensor([a.prompt + a.answer])
        data = train.extract(loaded.model, ids, 1, progress=False,
                             taps=head.config.feature_layers)
        expected = train.held_out(head, embed, lm_head, data, 2, first=len(a.prompt) - 1)
        assert found[a.kind] == expected


def test_bad_input_gets_a_clear_error(target: Path, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        acceptance.main(["--target", str(target), "--head", str(tmp_path / "none")])
    assert "none does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        acceptance.main(["--target", str(target), "--steps", "0"])
    assert "must be positive" in capsys.readouterr().err
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps({"prompts": [{"kind": "poetry", "prompt": "a poem"}]}))
    with pytest.raises(SystemExit, match="holds no prompts"):
        acceptance.main(["--target", str(target), "--prompts", str(prompts)])
    prompts.write_text("not json")
    with pytest.raises(SystemExit, match="not a benchmark prompts file"):
        acceptance.main(["--target", str(target), "--prompts", str(prompts)])
    prompts.write_text(json.dumps(PROMPTS))
    loaded = train.load_target(str(target), None, "auto")
    head = write_head(tmp_path / "h.safetensors", loaded, (), seed=1)
    kept = tmp_path / "answers.json"
    kept.write_text("[1, 2]")
    with pytest.raises(SystemExit, match="not an answers file"):
        acceptance.main(["--target", str(target), "--prompts", str(prompts), "--head", str(head),
                         "--answers", str(kept)])
    assert kept.read_text() == "[1, 2]"  # left as it was
    other = save_tiny(tmp_path / "other", layers=4, seed=7)
    with pytest.raises(SystemExit, match=r"h\.safetensors"):  # a head for another target
        acceptance.main(["--target", str(other), "--prompts", str(prompts), "--head", str(head)])
    with pytest.raises(SystemExit, match="no head for"):
        acceptance.main(["--target", str(other), "--prompts", str(prompts),
                         "--data-dir", str(tmp_path / "data")])
