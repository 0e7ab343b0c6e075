"""The load benchmark (``python -m engine.bench --concurrency``) end to end on the light
model: its levels, its reference answers and its table (no timing assertions)."""

import pytest

from engine.spec.session import ChatEngine
from engine.tools.load import load_markdown, parse_levels, round_ratios, run_load
from tests.conftest import LIGHT

PROMPTS = ["Write a Python function that adds two numbers.", "Name three colours."]


def test_levels_parse_and_bad_ones_say_why() -> None:
    assert parse_levels("4,1,2,2") == [1, 2, 4]
    for bad in ("", "one,two", "0,2", "-1"):
        with pytest.raises(ValueError, match="--concurrency"):
            parse_levels(bad)


def test_every_level_answers_as_alone_off_and_on() -> None:
    engine = ChatEngine.load(LIGHT)  # its own: the scheduler opens slots on it
    with pytest.raises(ValueError, match="at least 2 rounds"):
        run_load(engine, PROMPTS, [1], max_tokens=4, rounds=1)
    data = run_load(engine, PROMPTS, [1, 2], max_tokens=12, rounds=3)
    assert data["slots"] == 2
    levels = {(row["concurrency"], row["mode"]): row for row in data["levels"]}
    assert list(levels) == [(1, "off"), (1, "on"), (2, "off"), (2, "on")]
    assert levels[1, "off"]["vs_one_plain"] == pytest.approx(1.0)
    assert levels[1, "off"]["methods"] == ["off"]
    assert set(levels[2, "on"]["methods"]) <= {*engine.methods, "off"}  # auto's choices
    for row in data["levels"]:
        assert row["answers"] == max(len(PROMPTS), 3 * row["concurrency"])  # three rounds
        assert len(row["round_s"]) == 3 and all(s > 0 for s in row["round_s"])
        assert row["identical"], row
        assert all(first is not None and first > 0 for first in row["first_token_s"])
        assert row["prompt_tokens_cached"] > 0.5  # each prompt was read once before timing
        assert row["total_tokens_per_s"] > 0
    assert data["batched_passes"].get("2.0", 0) > 0  # the 2-at-once level shared passes
    table = load_markdown(data)
    assert "| 2 | on |" in table and "| 1 | off |" in table and "NO" not in table
    assert "Speculation on ÷ off, round by round" in table and "2 at once: " in table


def test_round_ratios_are_off_time_over_on_time_per_concurrency() -> None:
    levels = [{"concurrency": 1, "mode": "off", "round_s": [2.0, 3.0]},
              {"concurrency": 1, "mode": "on", "round_s": [1.0, 4.0]},
              {"concurrency": 2, "mode": "off", "round_s": []},
              {"concurrency": 2, "mode": "on", "round_s": [1.0]}]
    assert round_ratios(levels) == {1: [2.0, 0.75]}  # no rounds at 2: no ratio
