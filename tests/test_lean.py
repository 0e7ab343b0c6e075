"""The lean decoding step computes exactly what the model's own forward computes."""

from pathlib import Path

import pytest
import torch

from engine.accelerate import accelerate
from engine.kvcache import growing_cache
from engine.lean import lean_step
from engine.runner import ModelRunner
from tests.test_fastlinear import NATIVE, gguf_model
from tests.tiny import tiny_model


@pytest.mark.parametrize("native", NATIVE)
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_lean_step_is_bit_identical_to_the_forward(tmp_path: Path, kind: str, native: bool
                                                   ) -> None:
    model, path = gguf_model(tmp_path, kind)
    accelerate(model, path, "int4+int8", native=native)
    step = lean_step(model)
    assert step is not None
    ours, theirs = growing_cache(model.config), growing_cache(model.config)
    prompt = torch.tensor([[3, 17, 42, 99, 7, 250, 11, 60]])
    with torch.inference_mode():
        model(input_ids=prompt, cache=ours)
        model(input_ids=prompt, cache=theirs)
        for new in ([5], [77, 300, 12], [9, 100, 42, 8, 1], [4]):
            rows = len(new)
            logits, hidden = step.step(new, ours, rows, keep=True)
            out = model(input_ids=torch.tensor([new]), cache=theirs, logits_to_keep=rows,
                        output_hidden_states=True)
            assert torch.equal(logits, out.logits)
            assert hidden is not None and torch.equal(hidden, out.hidden_states[-1])
        ours.crop(-3)
        theirs.crop(-3)
        logits, hidden = step.step([6, 7], ours, 1, keep=False)
        out = model(input_ids=torch.tensor([[6, 7]]), cache=theirs, logits_to_keep=1)
        assert torch.equal(logits, out.logits) and hidden is None


def test_models_off_row_attention_keep_their_own_forward() -> None:
    model = tiny_model("llama", dtype=torch.float32)
    assert lean_step(model) is None
    assert ModelRunner(model).lean is None
    accelerate(model, None, "fp32", row_attention=True)
    step = lean_step(model)
    assert step is not None
    with pytest.raises(ValueError, match="lean step"):
        step.step(list(range(17)), growing_cache(model.config), 1, keep=False)
