"""Calibration and the automatic method: pure functions of measured figures (synthetic
costs, a test clock; nothing here is timed)."""

import json
from collections.abc import Generator, Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from engine.spec.calibration import (
    BORROWED_DRAFTS,
    CHECK_PASSES,
    CONTEXT,
    KINDS,
    MAX_ENTRIES,
    MAX_K,
    OBSERVED_TOKENS,
    ORDER,
    OTHER_KINDS,
    PRIOR_ANSWERS,
    PRIOR_FORMAT,
    PRIOR_SUFFIX,
    UNTRIED,
    Calibration,
    CalibrationCache,
    Choice,
    Observations,
    Prediction,
    Seen,
    cache_key,
    choose,
    classify,
    measure,
    non_decreasing,
    parts_step,
    pass_speedup,
    predict,
    shipped_observations,
)
from engine.spec.drafters import Draft, Drafter
from engine.spec.drafters.ngram import NgramDrafter
from engine.spec.drafters.suffix import SuffixDrafter
from engine.spec.policy import DraftPolicy
from engine.spec.runner import Head, ModelRunner
from engine.spec.session import ChatEngine
from engine.tools import bench
from tests.tiny import tiny_loaded, tiny_model

BENCH = Path(__file__).resolve().parent.parent / "assets" / "bench" / "prompts.json"
BENCH_KINDS = bench.QUESTION_KINDS
# t(k)/t(1) as measured on the Zen 5 machine (machines-measured.md), interpolated
ZEN5 = {2: 1.08, 3: 1.43, 4: 1.67, 5: 2.06, 8: 3.21}


def calibration(step: dict[str, float], read: dict[str, float] | None = None,
                ratios: dict[int, float] | None = None) -> Calibration:
    return Calibration("k", 0.05, ratios or ZEN5, step, read or {})


def seen(accepted: float, rejected: float, asked: float = 0.0, found: float = 0.0) -> Seen:
    return Seen(accepted, rejected, asked or accepted + rejected, found or asked or
                accepted + rejected, 1.0)


def test_the_bench_prompts_are_classified_as_their_kind() -> None:
    prompts = json.loads(BENCH.read_text())["prompts"]
    assert [classify(p["prompt"]) for p in prompts] == [BENCH_KINDS[p["kind"]] for p in prompts]
    assert set(BENCH_KINDS.values()) == set(KINDS)


def test_ratios_interpolate_between_and_beyond_measured_sizes() -> None:
    cal = calibration({})
    assert cal.ratio_at(1) == 1.0 and cal.ratio_at(4) == 1.67
    assert cal.ratio_at(6) == pytest.approx(2.06 + (3.21 - 2.06) / 3)
    assert cal.ratio_at(10) == pytest.approx(3.21 + 2 * (3.21 - 2.06) / 3)  # the last slope
    assert cal.verify_cost(5) == pytest.approx(0.05 * 2.06)


def test_live_figures_fold_in_with_a_bounded_weight() -> None:
    cal = calibration({"ngram": 0.01})
    slower = cal.fold(t1=0.1, ratios={4: 2.0, 40: 9.0}, step={"ngram": 0.002, "draft": 0.02},
                      weight=0.5)
    assert slower.t1 == pytest.approx(0.075) and slower.source == "live"
    assert slower.ratios[4] == pytest.approx((1.67 + 2.0) / 2) and 40 not in slower.ratios
    assert slower.step["ngram"] == pytest.approx((0.01 + 0.002 / 0.075) / 2)
    assert slower.step["draft"] == pytest.approx(0.02 / 0.075)  # first seen: taken as is
    assert cal.t1 == 0.05  # the original is unchanged
    again = Calibration.from_json(json.loads(json.dumps(slower.to_json())))
    assert (again.t1, dict(again.ratios), dict(again.step)) == (
        slower.t1, dict(slower.ratios), dict(slower.step))


def test_a_cheap_well_accepted_lookup_beats_a_draft_model_that_reads_the_prompt() -> None:
    cal = calibration({"ngram": 0.002, "draft": 0.28}, {"draft": 0.05})
    observed = Observations()
    observed.record("ngram", "summary", seen(60, 20, asked=40, found=30), 600, 128)
    observed.record("draft", "summary", seen(80, 20), 600, 128)
    predictions = predict(cal, observed, ["off", "ngram", "draft"], "summary", 15)
    assert [p.method for p in predictions] == ["ngram", "draft"]
    ngram, draft = predictions
    assert ngram.speedup > 1.1 and ngram.coverage == pytest.approx(31 / 41)
    assert draft.speedup < ngram.speedup and draft.read == 0.05
    choice = choose(predictions, "summary")
    assert choice.method == "ngram"
    assert choice.reason == (f"ngram: {ngram.speedup:.2f}× predicted on this machine; "
                             f"draft model: {draft.speedup:.2f}×")


def test_under_load_a_model_drafter_gives_way_to_lookups() -> None:
    """Alone the hybrid wins on its cheap lookups (which find a draft in most passes of
    this kind); beside three other answers it is costed at its draft model's step and
    prompt reading, which stall them all."""
    cal = calibration({"ngram": 0.002, "suffix": 0.002, "hybrid": 0.002, "draft": 0.28},
                      {"draft": 0.05, "hybrid": 0.05})
    observed = Observations()
    observed.record("ngram", "code", seen(40, 20, asked=40, found=25), 300, 128)
    observed.record("suffix", "code", seen(60, 20, asked=40, found=38), 300, 128)
    observed.record("hybrid", "code", seen(90, 15), 300, 128)
    parts = {"hybrid": ("suffix", "draft")}
    alone = predict(cal, observed, ["ngram", "hybrid"], "code", 8, parts=parts)
    busy = predict(cal, observed, ["ngram", "hybrid"], "code", 8, others=3, parts=parts)
    assert alone[0].method == "hybrid" and busy[0].method == "ngram"
    assert busy[0].speedup < alone[-1].speedup  # the gain shrinks under load
    assert {p.method: p.step for p in busy}["hybrid"] == 0.28


def test_a_head_whose_cached_prompt_lacks_features_pays_for_reading_it_again() -> None:
    """EAGLE wins on a prompt cached with features; when the target would read a cached
    prompt again to get them, that reading (at a 16-row pass's cost per token) counts."""
    cal = calibration({"ngram": 0.002, "eagle": 0.08}, {"eagle": 0.01})
    observed = Observations()
    observed.record("ngram", "chat", seen(30, 30, asked=40, found=15), 200, 128)
    observed.record("eagle", "chat", seen(80, 40), 200, 128)
    kept = predict(cal, observed, ["ngram", "eagle"], "chat", 8)
    again = predict(cal, observed, ["ngram", "eagle"], "chat", 8, rereads={"eagle": 250})
    assert kept[0].method == "eagle" and again[0].method == "ngram"
    eagle = {p.method: p for p in kept}["eagle"]
    slower = {p.method: p for p in again}["eagle"]
    per_token = cal.ratio_at(16) / 16
    assert 128 / slower.speedup == pytest.approx(128 / eagle.speedup + 250 * per_token)


def test_a_draft_model_pays_for_what_it_must_read_of_this_question() -> None:
    """The kind's typical new prompt tokens cost a draft model nothing where the target has
    the prompt cached; but a draft model whose cache holds another conversation reads its
    whole window first, and for the question at hand that reading counts."""
    cal = calibration({"ngram": 0.002, "draft": 0.25}, {"draft": 0.08})
    observed = Observations()
    observed.record("ngram", "code", seen(30, 30, asked=40, found=20), 1, 128)
    observed.record("draft", "code", seen(100, 15), 1, 128)  # prompts found cached
    typical = predict(cal, observed, ["ngram", "draft"], "code", 8)
    behind = predict(cal, observed, ["ngram", "draft"], "code", 8, reads={"draft": 256})
    level = predict(cal, observed, ["ngram", "draft"], "code", 8, reads={"draft": 1})
    assert typical[0].method == "draft" and behind[0].method == "ngram"
    assert [p.speedup for p in level] == [p.speedup for p in typical]
    draft = {p.method: p for p in typical}["draft"]
    slower = {p.method: p for p in behind}["draft"]
    assert 128 / slower.speedup == pytest.approx(128 / draft.speedup + 255 * 0.08)
    assert {p.method: p.speedup for p in behind}["ngram"] == typical[1].speedup


def test_a_hybrid_alone_costs_its_draft_model_where_its_lookup_finds_nothing() -> None:
    """Calibration measures the hybrid on repetitive text, where its lookup always finds a
    draft (a step of 0.002 here); on chat the lookup found a draft in a quarter of its
    passes, so three passes in four cost the draft model's step."""
    cal = calibration({"suffix": 0.002, "draft": 0.28, "hybrid": 0.002})
    observed = Observations()
    observed.record("suffix", "chat", seen(10, 10, asked=80, found=20), 200, 128)
    observed.record("hybrid", "chat", seen(80, 20), 200, 128)
    parts = ("suffix", "draft")
    found = 21 / 82  # with a prior of one pass found and one not
    alone = parts_step(cal, observed, parts, "chat", 0.002)
    assert alone == pytest.approx(found * 0.002 + (1 - found) * 0.28)
    assert parts_step(cal, observed, parts, "chat", 0.002, others=2) == 0.28
    hybrid = predict(cal, observed, ["hybrid"], "chat", 8, parts={"hybrid": parts})[0]
    assert hybrid.step == pytest.approx(alone)


def test_auto_keeps_the_best_method_measuring_when_none_is_predicted_faster() -> None:
    """Its adaptive policy switches drafting off where it does not pay; plain decoding
    for good would never correct a calibration measured in a busy moment."""
    cal = calibration({"draft": 0.4}, {"draft": 0.1})
    observed = Observations()
    observed.record("draft", "chat", seen(2, 20), 50, 100)
    choice = choose(predict(cal, observed, ["draft"], "chat", 15), "chat")
    assert choice.method == "draft"
    assert choice.reason.startswith("no method predicted faster than plain decoding")
    assert choose((), "chat").method == "ngram"  # nothing measured yet: the fallback


def test_the_choice_follows_the_kind_of_prompt() -> None:
    cal = calibration({"ngram": 0.002, "eagle": 0.07}, {"eagle": 0.01})
    observed = Observations()
    for _ in range(5):
        observed.record("ngram", "summary", seen(90, 10), 600, 128)
        observed.record("ngram", "chat", seen(1, 30, asked=100, found=30), 20, 200)
        observed.record("eagle", "summary", seen(30, 30), 600, 128)
        observed.record("eagle", "chat", seen(150, 50), 20, 200)
    pick = {kind: choose(predict(cal, observed, ["ngram", "eagle"], kind, 15)).method
            for kind in ("summary", "chat")}
    assert pick == {"summary": "ngram", "chat": "eagle"}


def test_a_method_never_seen_on_a_kind_borrows_a_bounded_share_of_its_other_evidence() -> None:
    observed = Observations()
    observed.record("ngram", "code", seen(4, 0), 100, 100)
    assert observed.evidence("ngram", "chat").accepted == pytest.approx(4 * OTHER_KINDS)
    observed.record("ngram", "code", seen(400, 0), 100, 100)
    many = 4 * 0.98 + 400
    assert observed.evidence("ngram", "chat").accepted == pytest.approx(BORROWED_DRAFTS)
    assert observed.evidence("ngram", "code").accepted == pytest.approx(many)
    assert observed.evidence("ngram", None).accepted == pytest.approx(many)
    assert observed.typical("code") == (100, 100)
    assert observed.typical("chat") == (1.0, 1.0)


def test_a_kind_with_evidence_of_its_own_is_not_outweighed_by_the_others() -> None:
    """What the shipped observations held for the draft model (scaled to four answers):
    0.93 accepted on code, summaries and editing, where adaptive drafting drafts much, and
    0.68 on chat, where it drafts little. A quarter of the others' evidence made chat's
    acceptance 0.89, and auto tried the draft model and the hybrid on chat, below plain."""
    observed = Observations()
    for kind, accepted, rejected in (("code", 353, 27), ("editing", 212, 28),
                                     ("summary", 301, 22), ("chat", 26, 12)):
        observed.record("draft", kind, seen(accepted, rejected), 100, 100)
    cal = calibration({"draft": 0.32}, {"draft": 0.1})
    [chat] = predict(cal, observed, ["draft"], "chat", 8)
    [code] = predict(cal, observed, ["draft"], "code", 8)
    own = (26 + DraftPolicy.alpha_prior) / (26 + 12 + 1)
    assert own < chat.alpha < own + 0.05
    assert code.alpha > 0.9
    assert chat.speedup < code.speedup


class TickClock:
    """Each reading is a millisecond after the one before: costs without timing."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 0.001
        return self.now


def measured(work: Generator[None, None, Calibration]) -> tuple[Calibration, int]:
    """Run :func:`measure`'s slices to the end: its calibration and how many slices."""
    slices = 0
    while True:
        try:
            next(work)
        except StopIteration as done:
            return done.value, slices
        slices += 1


def test_measuring_runs_in_slices_and_covers_every_size_and_drafter() -> None:
    target = tiny_model("llama", vocab_size=64, seed=1)
    drafters = {"ngram": NgramDrafter(), "suffix": SuffixDrafter([])}
    cal, slices = measured(measure(target, drafters, "key", budget_s=0.0, clock=TickClock()))
    assert slices > 2  # a forward a slice
    assert isinstance(cal, Calibration) and cal.key == "key"
    assert sorted(cal.ratios) == [2, 4, 8, 16]  # no budget: 1, 2, 4, 8 and 16 rows only
    whole = measure(target, drafters, "key", budget_s=1e9, clock=TickClock(), max_rounds=1)
    assert sum(1 for _ in whole) > MAX_K  # a round of every size, a forward a slice
    assert cal.ratios[2] == pytest.approx(1.0)  # every forward takes one tick here
    assert set(cal.step) == {"ngram", "suffix"} and cal.read == {}


def test_a_slow_context_read_leaves_the_budget_to_the_measuring(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a slow machine reading the context took most of the budget, so t(4..16) were
    extrapolated from t(1) and t(2); the budget now starts once the context is read."""
    clock = TickClock()
    sync = ModelRunner.sync

    def slow_sync(runner: ModelRunner, ids: list[int]) -> object:
        clock.now += 100.0  # far beyond the budget
        return sync(runner, ids)

    monkeypatch.setattr(ModelRunner, "sync", slow_sync)
    cal, _ = measured(measure(tiny_model("llama", vocab_size=64, seed=1), {}, "key",
                              budget_s=1.0, clock=clock, max_rounds=1))
    assert sorted(cal.ratios) == list(range(2, MAX_K + 1))  # a whole round fitted


class SpellClock:
    """A clock that only the measured work moves: a forward over ``k`` rows costs
    ``1 + 0.1 (k - 1)`` units and a draft step ``0.25``, times the machine's speed, which
    drops threefold from the ``slow_from``-th piece of work on (a slow spell)."""

    def __init__(self, slow_from: int) -> None:
        self.now, self.done, self.slow_from = 0.0, 0, slow_from

    def __call__(self) -> float:
        return self.now

    def work(self, units: float) -> None:
        self.done += 1
        self.now += units * (3.0 if self.done >= self.slow_from else 1.0)


class Stepping(Drafter):
    """Drafts one token a call, each costing a quarter of a one-row forward."""

    name = "stepping"

    def __init__(self, clock: SpellClock) -> None:
        self.clock = clock

    def propose(self, context, k, params, generator) -> Draft:  # type: ignore[no-untyped-def]
        self.clock.work(0.25)
        return Draft((1,))


@pytest.mark.parametrize("slow_from", [3, 13, 25, 41, 1000])  # a pair's t(1) slowed first
def test_a_slow_spell_while_measuring_leaves_the_ratios_and_steps_right(
    monkeypatch: pytest.MonkeyPatch, slow_from: int,
) -> None:
    """Each cost is measured against a t(1) taken just before it, so a spell that slows
    the machine halfway through does not show as a dearer t(k) or draft step. (A spell
    that begins between a pair's two forwards still misleads that pair; with time for
    more rounds, the other rounds' pairs outvote it.)"""
    clock = SpellClock(slow_from)
    forward = ModelRunner.forward

    def timed(runner: ModelRunner, ids: list[int], rows: int = 1, head: Head | None = None
              ) -> object:
        clock.work(1 + 0.1 * (rows - 1))
        return forward(runner, ids, rows=rows, head=head)

    monkeypatch.setattr(ModelRunner, "forward", timed)
    cal, _ = measured(measure(tiny_model("llama", vocab_size=64, seed=1),
                              {"stepping": Stepping(clock)}, "key", budget_s=1e9, clock=clock,
                              max_rounds=1))
    assert sorted(cal.ratios) == list(range(2, MAX_K + 1))
    for k, ratio in cal.ratios.items():
        assert ratio == pytest.approx(1 + 0.1 * (k - 1)), k
    assert cal.step["stepping"] == pytest.approx(0.25)


def test_a_round_measures_short_drafts_sizes_three_times_each_after_a_t1(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rows_run: list[int] = []
    forward = ModelRunner.forward

    def counted(runner: ModelRunner, ids: list[int], rows: int = 1, head: Head | None = None
                ) -> object:
        rows_run.append(rows)
        return forward(runner, ids, rows=rows, head=head)

    monkeypatch.setattr(ModelRunner, "forward", counted)
    measured(measure(tiny_model("llama", vocab_size=64, seed=1), {}, "key", budget_s=1e9,
                     clock=TickClock(), max_rounds=1))
    measuring = rows_run[-2 * len(ORDER) :]  # the round's t(1), t(k) pairs
    assert measuring[0::2] == [1] * (len(measuring) // 2)
    sizes = measuring[1::2]
    assert {k: sizes.count(k) for k in (2, 3, 4, 5)} == {2: 3, 3: 3, 4: 3, 5: 3}
    assert sorted(set(sizes)) == list(range(2, MAX_K + 1))


def test_ratios_are_fitted_non_decreasing_by_pooling_the_sizes_out_of_order() -> None:
    assert non_decreasing({2: 0.9, 3: 1.1, 4: 1.3}) == {2: 0.9, 3: 1.1, 4: 1.3}
    fitted = non_decreasing({2: 0.9, 4: 1.3, 5: 2.2, 6: 1.0, 8: 2.0})
    assert fitted == pytest.approx({2: 0.9, 4: 1.3, 5: 1.6, 6: 1.6, 8: 2.0})
    # a run of violators pools into one mean, and t(2) may stay below t(1)
    assert non_decreasing({2: 0.7, 3: 1.5, 4: 1.2, 5: 0.9}) == pytest.approx(
        {2: 0.7, 3: 1.2, 4: 1.2, 5: 1.2})
    assert non_decreasing({}) == {}


def test_the_cache_keeps_entries_by_machine_and_models(tmp_path: Path) -> None:
    path = tmp_path / "calibration.json"
    cache = CalibrationCache(path)
    observed = Observations()
    observed.record("ngram", "code", seen(3, 1), 10, 20)
    cache.save("a", calibration({"ngram": 0.01}), observed)
    cache.save("b", None, Observations())
    loaded, seen_again = cache.load("a")
    assert loaded is not None and loaded.source == "cache" and loaded.step == {"ngram": 0.01}
    assert seen_again.evidence("ngram", "code").accepted == 3
    assert cache.load("b")[0] is None and cache.load("c")[0] is None
    path.write_text("{not json")
    assert cache.load("a")[0] is None
    assert cache_key({"cpu": "x"}, ["m"]) != cache_key({"cpu": "y"}, ["m"])


def test_the_cache_keeps_only_the_most_recently_saved_entries(tmp_path: Path) -> None:
    """Models replaced or moved leave keys no worker reads again: the file keeps the
    newest ``MAX_ENTRIES``, and saving an old key again makes it the newest."""
    cache = CalibrationCache(tmp_path / "calibration.json")
    keys = [f"k{i}" for i in range(MAX_ENTRIES + 3)]
    for key in keys:
        cache.save(key, calibration({"ngram": 0.01}), Observations())
    kept = [key for key in keys if cache.load(key)[0] is not None]
    assert kept == keys[-MAX_ENTRIES:]
    cache.save(kept[0], calibration({"ngram": 0.02}), Observations())
    cache.save("new", None, Observations())
    assert cache.load(kept[0])[0] is not None and cache.load(kept[1])[0] is None
    assert len(json.loads((tmp_path / "calibration.json").read_text())["entries"]) == MAX_ENTRIES


def test_an_engine_calibrates_once_then_reads_its_cache(tmp_path: Path) -> None:
    target = tiny_loaded("tiny-target", seed=1, scale=4.0)
    draft = tiny_loaded("tiny-draft", seed=2, scale=4.0)
    engine = ChatEngine(target, draft)
    path = tmp_path / "calibration.json"
    work = engine.calibrate(path, budget_s=0.0)
    assert sum(1 for _ in work) > 0 and engine.calibration is not None
    assert {"draft", "ngram", "suffix", "hybrid"} <= set(engine.calibration.step)
    assert "draft" in engine.calibration.read
    events = list(engine.generate([{"role": "user", "content": "Say hi"}], max_tokens=6))
    assert engine.last_choice is not None and engine.last_choice.predictions
    assert events[-1].stats.method == engine.last_choice.method  # type: ignore[union-attr]
    assert events[-1].stats.trial == engine.last_choice.trial  # type: ignore[union-attr]
    report = engine.speculation_report()
    assert set(report["kinds"]) == set(KINDS) and report["calibration"]["t1_ms"] > 0
    again = ChatEngine(target, draft)
    for _ in again.calibrate(path):  # t(1) checked, measured again if it moved (below)
        pass
    assert again.calibration is not None
    assert again.observations.seen  # the answer above was remembered
    ran = events[-1].stats.method  # type: ignore[union-attr]
    timed = again.observations.seen[ran][classify("Say hi")]
    assert timed.tokens > 0 and timed.cost > 0  # the speed it showed, in t(1)


@pytest.mark.parametrize(("cached_t1", "trusted"), [
    (0.001, True), (0.00125, True), (0.0008, True),  # within DRIFT of TickClock's 1 ms
    (0.0025, False),  # taken in a slow moment: every live t(k) would look cheap
    (0.0007, False),  # the machine is busier now than when it was measured
])
def test_a_cached_calibration_is_measured_again_when_t1_has_moved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cached_t1: float, trusted: bool,
) -> None:
    """At start an engine measures t(1) (a few one-row forwards) and keeps its cached
    calibration only if the two agree within DRIFT; otherwise it measures the whole
    calibration again, and keeps what the methods were seen to accept. A 145 ms t(1)
    cached from a slow moment on a 65 ms machine once made auto run a losing method."""
    engine = ChatEngine(tiny_loaded("tiny-target", seed=1, scale=4.0),
                        tiny_loaded("tiny-draft", seed=2, scale=4.0))
    reads: list[int] = []  # prompts the target read into a cache (the check's context)
    sync = ModelRunner.sync

    def counted(runner: ModelRunner, ids: Sequence[int]) -> None:
        if runner.model is engine.target.model and len(ids) >= CONTEXT - 1:
            reads.append(len(ids))
        sync(runner, ids)

    monkeypatch.setattr(ModelRunner, "sync", counted)
    path = tmp_path / "calibration.json"
    observed = Observations()
    observed.record("ngram", "code", seen(3, 1), 10, 20)
    cached = replace(calibration({"ngram": 0.01}), key=engine.calibration_key, t1=cached_t1)
    CalibrationCache(path).save(engine.calibration_key, cached, observed)
    work = engine.calibrate(path, budget_s=0.0, clock=TickClock())
    first = next(work)
    assert first is None and engine.calibration is not None  # the cached one, meanwhile
    assert engine.calibration.step == {"ngram": 0.01}
    slices = 1 + sum(1 for _ in work)
    assert engine.calibration.source == ("cache" if trusted else "measured")
    assert (slices <= CHECK_PASSES + 2) == trusted  # context, warm-up, then the forwards
    assert engine.calibration.t1 == pytest.approx(cached_t1 if trusted else 0.001)
    assert reads == [CONTEXT]  # measured again after the check's context, not a second read
    assert engine.observations.evidence("ngram", "code").accepted == 3
    again, _ = CalibrationCache(path).load(engine.calibration_key)
    assert again is not None and again.t1 == pytest.approx(engine.calibration.t1)


def test_speed_seen_on_one_kind_is_not_borrowed_by_another() -> None:
    """A lookup's answers ran fast on summaries (quoting the document); on chat its
    acceptance borrows a quarter of that evidence, but not its speed, and it is still
    untimed there, so a close call on chat still tries it."""
    cal = calibration({"ngram": 0.002, "eagle": 0.08}, {"eagle": 0.01})
    observed = Observations()
    for _ in range(4):
        observed.record("ngram", "summary", Seen(90, 10, 30, 20, 1, tokens=128, cost=64),
                        300, 128)
    chat = {p.method: p for p in predict(cal, observed, ["ngram", "eagle"], "chat", 8)}
    summary = {p.method: p for p in predict(cal, observed, ["ngram", "eagle"], "summary", 8)}
    assert summary["ngram"].observed == pytest.approx(2.0)
    assert summary["ngram"].observed_tokens == pytest.approx(128 * sum(0.98**i for i in range(4)))
    assert chat["ngram"].observed is None and chat["ngram"].observed_tokens == 0.0
    assert chat["ngram"].alpha > 0.6  # the acceptance is borrowed at OTHER_KINDS
    overall = {p.method: p for p in predict(cal, observed, ["ngram"], None, 8)}
    assert overall["ngram"].observed == pytest.approx(2.0)  # every kind, for the overall


def test_a_one_token_answer_teaches_nothing() -> None:
    """A warm-up (``max_tokens: 1``) has no pass after its first token: recorded, it
    would halve the kind's typical answer and double the weight of prompt reading."""
    engine = ChatEngine(tiny_loaded("tiny-target", seed=1, scale=4.0), None)
    for _ in engine.calibrate(None, budget_s=0.0):
        pass
    chat = [{"role": "user", "content": "Say hi"}]
    list(engine.generate(chat, max_tokens=1, method="ngram"))
    assert engine.observations.seen == {} and engine.observations.lengths == {}
    list(engine.generate(chat, max_tokens=6, method="ngram"))
    kind = classify("Say hi")
    assert engine.observations.seen["ngram"][kind].answers == 1.0
    assert engine.observations.lengths[kind].answer > 1


def test_shipped_observations_start_a_fresh_engine_where_the_models_match(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """What the benchmark saw the same models do, scaled to a few answers, steers the
    first choices: a lookup that found nothing on code no longer looks like free drafts."""
    shown = Observations()
    for _ in range(20):
        shown.record("suffix", "code", seen(1, 10, asked=100, found=5), 80, 128)
        shown.record("draft", "code", seen(200, 40), 80, 128)
    data = {"format": PRIOR_FORMAT, "models": ["target", "draft"],
            "observations": shown.to_json()}
    (tmp_path / f"pair{PRIOR_SUFFIX}").write_text(json.dumps(data))
    (tmp_path / f"broken{PRIOR_SUFFIX}").write_text("{")
    (tmp_path / f"other{PRIOR_SUFFIX}").write_text(json.dumps({**data, "models": ["x", None]}))
    start = shipped_observations(["target", "draft"], tmp_path)
    code = start.seen["suffix"]["code"]
    assert code.answers == pytest.approx(PRIOR_ANSWERS)  # 20 answers' worth scaled down
    assert code.found / code.asked == pytest.approx(0.05)  # the shares stay as measured
    assert start.lengths["code"].answers == pytest.approx(PRIOR_ANSWERS)
    assert "broken" in caplog.text  # an unreadable file is skipped, named in the log
    assert shipped_observations(["target", None], tmp_path).seen == {}
    cal = calibration({"suffix": 0.001, "draft": 0.25}, {"draft": 0.02})
    fresh = choose(predict(cal, Observations(), ["suffix", "draft"], "code", 8), "code")
    primed = choose(predict(cal, start, ["suffix", "draft"], "code", 8), "code")
    assert (fresh.method, primed.method) == ("suffix", "draft")
    timed = Observations()
    timed.record("draft", "code", Seen(50, 10, 30, 30, 1, tokens=100, cost=80), 80, 128)
    data["observations"] = timed.to_json()
    (tmp_path / f"pair{PRIOR_SUFFIX}").write_text(json.dumps(data))
    shipped = shipped_observations(["target", "draft"], tmp_path).seen["draft"]["code"]
    assert (shipped.tokens, shipped.cost) == (0.0, 0.0)  # another machine's speed: dropped
    assert shipped.accepted == 50  # its acceptance kept


def test_a_method_s_observed_speed_outweighs_the_cost_model_as_its_tokens_grow() -> None:
    """The cost model prefers the head (cheap steps, fair acceptance); its answers here
    ran at 0.9 tokens per t(1) (costs the model leaves out), the draft model's at 1.3."""
    cal = calibration({"draft": 0.3, "eagle": 0.05})
    def observed(tokens: float) -> Observations:
        out = Observations()
        out.record("draft", "chat", seen(70, 30), 0, 128)
        out.record("eagle", "chat", seen(60, 40), 0, 128)
        out.seen["draft"]["chat"].tokens, out.seen["draft"]["chat"].cost = tokens, tokens / 1.3
        out.seen["eagle"]["chat"].tokens, out.seen["eagle"]["chat"].cost = tokens, tokens / 0.9
        return out
    model = predict(cal, observed(0), ["draft", "eagle"], "chat", 8)
    assert model[0].method == "eagle" and model[0].observed is None
    few = predict(cal, observed(8), ["draft", "eagle"], "chat", 8)
    assert few[0].method == "eagle"  # a few tokens do not overturn the model
    many = predict(cal, observed(4 * OBSERVED_TOKENS), ["draft", "eagle"], "chat", 8)
    assert many[0].method == "draft" and many[0].observed == pytest.approx(1.3)
    eagle = {p.method: p for p in many}["eagle"]
    modelled = {p.method: p for p in model}["eagle"].speedup
    assert eagle.speedup == pytest.approx(0.2 * modelled + 0.8 * 0.9)  # weights 1 : 4
    busy = predict(cal, observed(4 * OBSERVED_TOKENS), ["draft", "eagle"], "chat", 8, others=1)
    alone_model = predict(cal, observed(0), ["draft", "eagle"], "chat", 8, others=1)
    assert [p.speedup for p in busy] == [p.speedup for p in alone_model]  # not under load


def test_under_load_no_draft_length_may_slow_the_others_pass() -> None:
    """Zen 5's t(k): alone a well-accepted free lookup pays; beside one other answer its
    first row would make their shared pass 32 % longer, so nothing is drafted."""
    cal = calibration({})
    alone = pass_speedup(0.8, 1.0, 0.001, cal.ratio_at, 8)
    assert alone[0] > 1.2 and alone[1] > 0
    assert pass_speedup(0.8, 1.0, 0.001, cal.ratio_at, 8, others=1) == (1.0, 0)
    flat = calibration({}, ratios={2: 1.005, 4: 1.015, 8: 1.035, 16: 1.08})
    shared = pass_speedup(0.8, 1.0, 0.001, flat.ratio_at, 8, others=1)
    assert shared[0] > 1.0 and shared[1] > 0  # nearly free rows: drafts still pay
    gamma = shared[1]
    drafted = 0.001 * (gamma + 0.8**gamma) + flat.ratio_at(gamma + 2)
    assert drafted <= 1.02 * flat.ratio_at(2)  # the other answer's pass: at most 2 % longer


def test_auto_tries_a_close_runner_up_once_and_then_goes_by_what_it_showed() -> None:
    """The cost model's errors exceed the gaps between close predictions, and only a
    method's own timed answers show them: one predicted within ``UNTRIED`` of the best
    but not yet timed here is tried; once timed, the observed speed decides."""
    def guess(method: str, speedup: float, timed: float = 0.0) -> Prediction:
        return Prediction(method, speedup, 0.6, 1.0, 3, 0.1, 0.0, 50.0,
                          None if not timed else speedup, timed)

    ran = guess("hybrid-eagle", 1.42, timed=512)
    assert choose([ran, guess("hybrid", 1.39)], "code").method == "hybrid"
    assert choose([ran, guess("hybrid", 1.39)], explore=False).method == "hybrid-eagle"  # load
    tried = choose([ran, guess("hybrid", 1.39)], "code")
    assert "not yet timed" in tried.reason and tried.predictions[0].method == "hybrid-eagle"
    assert tried.trial and not choose([ran, guess("hybrid", 1.39)], explore=False).trial
    assert not choose([]).trial  # nothing measured: the fallback is no trial
    assert choose([ran, guess("hybrid", 1.39, timed=512)]).method == "hybrid-eagle"
    far = 1.42 * (1 + UNTRIED * OBSERVED_TOKENS / (512 + OBSERVED_TOKENS)) / (1 + UNTRIED) * 0.99
    assert choose([ran, guess("ngram", far)]).method == "hybrid-eagle"  # too far to try
    # nothing timed yet (a fresh engine): every method equally hopeful, the best runs
    assert choose([guess("ngram", 1.30), guess("hybrid", 1.31)]).method == "hybrid"
    # end to end: the speed hybrid's answers showed replaces the hope
    cal = calibration({"hybrid-eagle": 0.003, "hybrid": 0.003})
    observed = Observations()
    observed.record("hybrid-eagle", "code", replace(seen(60, 30), tokens=512, cost=512 / 1.5),
                    100, 256)
    observed.record("hybrid", "code", seen(58, 30), 100, 256)
    first = choose(predict(cal, observed, ["hybrid-eagle", "hybrid"], "code", 8), "code")
    assert first.method == "hybrid"
    observed.record("hybrid", "code", Seen(answers=1.0, tokens=512, cost=512 / 1.2), 100, 256)
    then = choose(predict(cal, observed, ["hybrid-eagle", "hybrid"], "code", 8), "code")
    assert then.method == "hybrid-eagle"


def test_a_policy_starts_from_the_drafter_s_measured_costs() -> None:
    measured = calibration(step={"eagle": 0.08}, read={"eagle": 0.007})
    policy = measured.policy("eagle", max_gamma=4)
    assert policy.t1 == 0.05 and policy.draft_cost == pytest.approx(0.004)
    assert policy.read_share == 0.007  # a probe's catch-up is costed from it
    assert set(policy.ratio) == {2, 3, 4, 5}  # sizes beyond max_gamma + 1 left out
    assert measured.policy("ngram", max_gamma=4).read_share is None


def test_an_answer_says_when_auto_ran_it_as_a_trial(monkeypatch: pytest.MonkeyPatch) -> None:
    """The answer's statistics carry Choice.trial, so a client (the held-out check) can
    tell auto's one-time trial of a runner-up from its settled choice."""
    engine = ChatEngine(tiny_loaded("tiny-target", seed=1, scale=4.0))
    ahead, tried = (Prediction(m, s, 0.6, 1.0, 2, 0.01, 0.0, 10.0) for m, s in
                    (("suffix", 1.30), ("ngram", 1.28)))
    for chosen, trial in ((Choice("ngram", "tried", "chat", (ahead, tried)), True),
                          (Choice("suffix", "best", "chat", (ahead, tried)), False),
                          (Choice("ngram", "not measured", "chat"), False)):
        monkeypatch.setattr(engine, "choice", lambda *_, c=chosen: c)
        *_, done = engine.generate([{"role": "user", "content": "Say hi"}], max_tokens=4)
        assert done.stats.method == chosen.method  # type: ignore[union-attr]
        assert done.stats.trial is trial  # type: ignore[union-attr]
    *_, done = engine.generate([{"role": "user", "content": "Say hi"}], max_tokens=4,
                               method="ngram")
    assert done.stats.trial is False  # type: ignore[union-attr]  # asked for, not chosen


def test_policies_made_before_the_calibration_take_its_figures() -> None:
    """An answer that ran before the worker's calibration finished left an adaptive policy
    that knew only the sizes it timed and priced the rest at a constant from another
    machine; when the calibration arrives it fills what the policy had not measured, and
    keeps what it had."""
    engine = ChatEngine(tiny_loaded("tiny-target", seed=1, scale=4.0),
                        tiny_loaded("tiny-draft", seed=2, scale=4.0))
    question = [{"role": "user", "content": "Say hi"}]
    list(engine.generate(question, max_tokens=8, method="draft"))
    policy = engine.policies[("draft", classify("Say hi"))]
    assert isinstance(policy, DraftPolicy)
    timed = dict(policy.ratio)
    assert policy.read_share is None and len(timed) < engine.max_adaptive
    for _ in engine.calibrate(None, budget_s=0.0):
        pass
    assert engine.calibration is not None
    calibrated = {k for k in engine.calibration.ratios if k <= engine.max_adaptive + 1}
    assert calibrated - set(timed) and calibrated <= set(policy.ratio)
    assert all(policy.ratio[k] == ratio for k, ratio in timed.items())
    assert policy.read_share == engine.calibration.read["draft"]
