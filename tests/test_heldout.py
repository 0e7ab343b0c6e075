"""The held-out check through the API (``python -m engine.tools.heldout``): its prompts
file, the alternating order of each pair, the summary's arithmetic, and one whole run
against a real worker process on tiny models."""

import json
from pathlib import Path
from typing import Any

import pytest

from engine.tools import heldout
from engine.tools.bench import KINDS
from engine.tools.heldout import (
    HeldOutError,
    Pair,
    Prompt,
    load_prompts,
    markdown,
    order,
    parse_methods,
    run_pairs,
    summarise,
)
from tests.tiny import save_tiny


def write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "prompts.json"
    path.write_text(json.dumps(data))
    return path


def test_the_shipped_held_out_prompts_cover_every_kind() -> None:
    prompts = load_prompts(heldout.PROMPTS)
    assert {p.kind for p in prompts} == set(KINDS)
    bench = json.loads((heldout.PROMPTS.parent / "prompts.json").read_text())["prompts"]
    assert not {p.prompt for p in prompts} & {p["prompt"] for p in bench}


@pytest.mark.parametrize(("data", "says"), [
    ([], "at least one prompt"),
    ({"prompts": []}, "at least one prompt"),
    ({"prompts": [{"kind": "poetry", "prompt": "x"}]}, "kind 'poetry'"),
    ({"prompts": [{"kind": "summary", "prompt": "  "}]}, "prompt 0 has no text"),
    ({"prompts": ["just text"]}, "kind None"),
])
def test_a_bad_prompts_file_is_refused_with_what_is_wrong(tmp_path: Path, data: object,
                                                          says: str) -> None:
    with pytest.raises(HeldOutError, match=says):
        load_prompts(write(tmp_path, data))


def test_an_unreadable_prompts_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "prompts.json"
    path.write_text("{not json")
    with pytest.raises(HeldOutError, match="cannot read"):
        load_prompts(path)
    with pytest.raises(HeldOutError, match="cannot read"):
        load_prompts(tmp_path / "missing.json")


def test_methods_are_checked_and_off_is_never_one_of_them() -> None:
    assert parse_methods("auto, ngram") == ["auto", "ngram"]
    for bad in ("off", "auto,off", "fast", ""):
        with pytest.raises(HeldOutError, match="--methods"):
            parse_methods(bad)


def test_each_side_goes_first_as_often_over_prompts_and_rounds() -> None:
    firsts = [order(r, i, "auto")[0] for r in range(2) for i in range(3)]
    assert firsts.count("auto") == firsts.count("off") == 3
    assert [order(0, i, "auto")[0] for i in range(3)] == ["auto", "off", "auto"]
    assert [order(1, i, "auto")[0] for i in range(3)] == ["off", "auto", "off"]
    assert all(sorted(order(r, i, "ngram")) == ["ngram", "off"] for r in range(2) for i in range(3))


META = {"date": "2026-12-04 03:00", "machine": "m", "cpu_flags": ["avx2"], "command": "c",
        "prompts": 1, "rounds": 1, "max_tokens": 8}


def pair(kind: str, method: str, ran: str, total: float, plain: float, same: bool = True) -> Pair:
    return Pair(0, kind, method, ran, total, plain, method, same, 10, 1.5)


def test_a_pair_says_where_each_answer_spent_its_time() -> None:
    p = Pair(0, "summary", "auto", "ngram", 3.0, 4.0, "auto", True, 11, 2.5,
             first_token_s=1.0, plain_first_token_s=1.5, passes=5, plain_passes=11)
    assert p.pass_ms == (500.0, 250.0)  # (3.0 - 1.0) / 4 and (4.0 - 1.5) / 10 after the first
    line = next(x for x in markdown(summarise([p], ["auto"]), [p], META).splitlines()
                if x.startswith("| 0 |"))
    assert "| 1.00 / 1.50 | 500 / 250 | yes |" in line
    unknown = pair("summary", "auto", "ngram", 3.0, 4.0)  # a worker that did not say
    assert unknown.pass_ms == (None, None)
    assert "| – / – | – / – |" in markdown(summarise([unknown], ["auto"]), [unknown], META)


def test_the_summary_sums_times_per_method_and_kind() -> None:
    pairs = [pair("summary", "auto", "ngram", 2.0, 4.0), pair("summary", "auto", "ngram", 4.0, 4.0),
             pair("free chat", "auto", "draft", 5.0, 4.0, same=False),
             pair("free chat", "ngram", "ngram", 1.0, 3.0)]
    auto, ngram = summarise(pairs, ["auto", "ngram"])
    assert auto["overall"] == pytest.approx(12.0 / 11.0)
    assert auto["kinds"] == {"summary": pytest.approx(8.0 / 6.0), "free chat": pytest.approx(0.8)}
    assert (auto["lowest"], auto["lowest_kind"], auto["lowest_ran"]) == (0.8, "free chat", "draft")
    assert (auto["identical"], auto["pairs"], auto["ran"]) == (2, 3, {"ngram": 2, "draft": 1})
    assert ngram["overall"] == pytest.approx(3.0) and ngram["pairs"] == 1
    assert auto["trials"] == 0 and "A trial is" not in markdown([auto], pairs, META)


def test_auto_s_trials_are_marked_where_the_worker_says_so() -> None:
    tried = Pair(0, "free chat", "auto", "hybrid", 5.0, 4.0, "auto", True, 10, 1.2, trial=True)
    pairs = [pair("summary", "auto", "ngram", 2.0, 4.0), tried]
    (auto,) = summarise(pairs, ["auto"])
    assert (auto["trials"], auto["lowest_ran"]) == (1, "hybrid (a trial)")
    text = markdown([auto], pairs, META)
    assert "| auto | hybrid (a trial) | auto |" in text and "A trial is a runner-up" in text
    assert "| auto | ngram | auto |" in text  # a settled choice stays unmarked


class FailingClient:
    """Answers ``good`` requests (ids [1, 2], one second each), then the worker is gone."""

    def __init__(self, good: int) -> None:
        self.good, self.asked = good, []

    def answer(self, prompt: str, method: str, max_tokens: int) -> dict[str, Any]:
        self.asked.append(method)
        if len(self.asked) > self.good:
            raise ConnectionRefusedError("connection refused")
        return {"ids": [1, 2], "spec": {"method": "ngram" if method == "auto" else method,
                                        "total_s": 1.0, "mean_accepted_length": None,
                                        "trial": method == "auto"}}


def test_an_answer_that_fails_keeps_the_finished_pairs_and_says_where() -> None:
    prompts = [Prompt("summary", "a"), Prompt("free chat", "b")]
    pairs: list[Pair] = []
    client = FailingClient(good=3)
    with pytest.raises(HeldOutError, match=r"round 0, prompt 1 \(free chat\), auto: .*"
                                           r"ConnectionRefusedError"):
        run_pairs(client, prompts, ["auto"], 1, 8, pairs)  # type: ignore[arg-type]
    assert client.asked == ["auto", "off", "off", "auto"]  # the second pair: off first
    assert [(p.kind, p.ran, p.identical, p.speedup, p.trial) for p in pairs] == [
        ("summary", "ngram", True, 1.0, True)]


def test_a_whole_check_against_a_fresh_worker(tmp_path: Path) -> None:
    target = save_tiny(tmp_path / "tiny-llama")
    draft = save_tiny(tmp_path / "tiny-draft")
    prompts = write(tmp_path, {"prompts": [
        {"kind": "code completion", "prompt": "def add(a, b): the quick brown fox"},
        {"kind": "free chat", "prompt": "How do I keep my desk tidy?"}]})
    out = tmp_path / "out"
    code = heldout.main(["--prompts", str(prompts), "--methods", "auto,ngram", "--rounds", "2",
                         "--max-tokens", "8", "--profile", "light",
                         f"--worker-arg=--target={target}", f"--worker-arg=--draft={draft}",
                         "--models-from", str(tmp_path / "models-home"),
                         "--data-dir", str(tmp_path / "data"), "--out", str(out)])
    assert code == 0
    (json_file,) = out.glob("heldout-light-*.json")
    data = json.loads(json_file.read_text())
    pairs = data["pairs"]
    assert len(pairs) == 2 * 2 * 2  # rounds x prompts x methods
    assert all(p["identical"] for p in pairs)  # tiny models, greedy: the same ids
    assert {p["first"] for p in pairs if p["method"] == "auto"} == {"auto", "off"}
    assert all(p["total_s"] > 0 and p["plain_s"] > 0 for p in pairs)
    for p in pairs:  # where each answer's time went, from the worker's own figures
        assert 0 < p["first_token_s"] < p["total_s"] and 0 < p["plain_first_token_s"] < p["plain_s"]
        # plain: a pass a token (the first token's too), and one for an end token if any
        assert p["plain_passes"] in (p["tokens"], p["tokens"] + 1)
        assert 0 < p["passes"] <= p["plain_passes"]
    assert {p["ran"] for p in pairs if p["method"] == "ngram"} == {"ngram"}
    assert [s["method"] for s in data["summary"]] == ["auto", "ngram"]
    assert data["meta"]["plans"]["target"]["backend"] in ("native", "reference")
    shared = (tmp_path / "models-home" / "models").resolve()
    assert (tmp_path / "data" / "models").resolve() == shared
    table = json_file.with_suffix(".md").read_text()
    assert "| auto |" in table and "8/8" not in table and "4/4" in table


def test_a_worker_that_cannot_load_stops_the_check_with_the_reason(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    prompts = write(tmp_path, {"prompts": [{"kind": "free chat", "prompt": "Hello?"}]})
    code = heldout.main(["--prompts", str(prompts), "--profile", "light",
                         f"--worker-arg=--target={tmp_path / 'no-such-model'}",
                         "--models-from", str(tmp_path / "home"),
                         "--data-dir", str(tmp_path / "data"), "--out", str(tmp_path / "out")])
    assert code == 2
    assert "could not load its models" in caplog.text and "no-such-model" in caplog.text
    assert not (tmp_path / "out").exists()
