"""The light model with its shipped EAGLE head: lossless greedy drafting that gets accepted."""

import pytest

from engine.heads.files import SHIPPED, head_file_name, read_info
from engine.spec.sampling import SamplingParams
from tests.conftest import LIGHT

PROMPTS = [
    "Write a Python function that returns the squares of a list of numbers.",
    "Explain in two sentences what a context manager is in Python.",
]


def test_the_shipped_light_head_names_its_target() -> None:
    info = read_info(SHIPPED / head_file_name(LIGHT))
    assert info.target == LIGHT and info.target_sha256
    assert (SHIPPED / head_file_name(LIGHT)).stat().st_size <= 40_000_000


def greedy(engine, prompt: str, method: str):  # type: ignore[no-untyped-def]
    """The engine's greedy answer's completion (40 tokens, 3 drafts per pass)."""
    messages = [{"role": "user", "content": prompt}]
    *_, done = engine.generate(messages, SamplingParams(), max_tokens=40, method=method,
                               num_draft_tokens=3)
    return done


@pytest.mark.model
def test_light_model_greedy_eagle_equals_plain(light_engine) -> None:  # type: ignore[no-untyped-def]
    assert "eagle" in light_engine.methods
    accepted = 0
    for prompt in PROMPTS:
        plain, eagle = (greedy(light_engine, prompt, m) for m in ("off", "eagle"))
        assert eagle.token_ids == plain.token_ids, prompt
        accepted += eagle.stats.accepted
    assert accepted > 0


@pytest.mark.model
def test_light_model_greedy_eagle_trees_equal_plain(light_engine, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    assert light_engine.runner.model_forward.plan.row_invariant  # the int4 kernels
    monkeypatch.setattr(light_engine.drafters["eagle"], "branches", 3)
    trees = []
    verify = light_engine.runner.forward_tree
    monkeypatch.setattr(light_engine.runner, "forward_tree",
                        lambda ids, parents: trees.append(parents) or verify(ids, parents))
    for prompt in PROMPTS:
        plain, tree = (greedy(light_engine, prompt, m) for m in ("off", "eagle"))
        assert tree.token_ids == plain.token_ids, prompt
    assert trees  # some passes verified a tree with alternatives
