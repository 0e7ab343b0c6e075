"""Training an EAGLE head for a few steps on a tiny model: loss falls, file loads, resumes."""

import json
from pathlib import Path

import torch

from engine.heads import train
from engine.heads.files import load_head, read_info
from tests.tiny import tiny_model


def test_a_few_training_steps_lower_the_loss_and_write_a_loadable_head(
    tiny_folder: Path, tmp_path: Path
) -> None:
    corpus = tmp_path / "corpus.jsonl"
    with corpus.open("w") as f:
        for i in range(40):
            answer = f"def add_{i}(a, b):\n    return a + b * {i}\n" * 2
            f.write(json.dumps({"messages": [{"role": "user", "content": f"Write add {i}."},
                                             {"role": "assistant", "content": answer}]}) + "\n")
    out = tmp_path / "head.safetensors"
    args = ["--target", str(tiny_folder), "--out", str(out), "--corpus", str(corpus),
            "--tokens", "1600", "--seq-len", "32", "--batch", "4", "--lr", "3e-3",
            "--checkpoint-every", "10", "--held-out", "0.2", "--ce-vocab", "200"]
    assert train.main([*args, "--steps", "20"]) == 0
    losses = torch.load(out.with_name(out.name + ".ckpt"), weights_only=True)["losses"]
    assert len(losses) == 20
    assert sum(losses[-4:]) < sum(losses[:4])
    assert train.main([*args, "--steps", "25"]) == 0  # resumes at step 20
    losses = torch.load(out.with_name(out.name + ".ckpt"), weights_only=True)["losses"]
    assert len(losses) == 25
    info = read_info(out)
    assert info.target == tiny_folder.name and 0.0 <= (info.held_out_acceptance or 0.0) <= 1.0
    assert info.corpus_tokens > 0
    model = tiny_model(dtype=torch.float32)
    head, _ = load_head(out, tiny_folder.name, None, model)
    assert head.config.hidden_size == model.config.hidden_size
