"""The benchmark's pure parts and one tiny end-to-end run (no timing assertions)."""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.cpu import kernels
from engine.cpu.layers import Int8Linear
from engine.cpu.quantize import accelerate, model_bytes
from engine.heads.files import HeadInfo, save_head
from engine.heads.model import EagleHead, HeadConfig
from engine.spec.calibration import Calibration, Seen
from engine.spec.drafters.eagle import eagle_for
from engine.spec.runner import ModelRunner
from engine.spec.session import ChatEngine
from engine.tools import bench
from engine.tools.bench import KINDS, PROMPTS, Row, Run
from tests.test_eagle import head_info, random_head
from tests.tiny import tiny_loaded


def test_shipped_prompts_cover_four_kinds_evenly() -> None:
    every = bench.load_prompts(PROMPTS, per_kind=100)
    assert len(every) >= 16
    assert all(sum(p["kind"] == k for p in every) >= 4 for k in KINDS)
    quick = bench.load_prompts(PROMPTS, per_kind=1)
    assert [p["kind"] for p in quick] == list(KINDS)


def test_summary_is_total_tokens_over_total_time_per_kind_and_overall() -> None:
    plain = Row("plain", [Run("code editing", [1, 2, 3, 4], 2.0),
                          Run("free chat", [5, 6], 2.0)])
    spec = Row("ngram", [Run("code editing", [1, 2, 3, 4], 1.0, passes=2, drafted=4, accepted=2),
                         Run("free chat", [5, 7], 2.0, passes=2, drafted=0, accepted=0)])
    table = {(r["row"], r["kind"]): r for r in bench.summarise([plain, spec], KINDS)}
    assert set(table) == {(n, k) for n in ("plain", "ngram")
                          for k in ("code editing", "free chat", "overall")}
    overall = table[("ngram", "overall")]
    assert overall["tokens_per_s"] == 6 / 3.0
    assert overall["speedup"] == (6 / 3.0) / (6 / 4.0)
    assert overall["acceptance_rate"] == 0.5 and overall["tokens_per_pass"] == 6 / 4
    assert overall["identical"] == "1/2"  # the free-chat answer differs from plain
    assert table[("ngram", "free chat")]["acceptance_rate"] is None
    assert table[("plain", "overall")]["tokens_per_pass"] is None
    assert overall["generation_tokens_per_s"] is None  # no first-token times: no such column


def test_generation_rate_leaves_out_the_time_to_the_first_token() -> None:
    plain = Row("plain", [Run("code editing", [1, 2, 3, 4], 2.0, first_s=0.5),
                          Run("free chat", [5, 6], 2.0, first_s=1.0),
                          Run("free chat", [7], 1.5, first_s=1.5)])
    spec = Row("ngram", [Run("code editing", [1, 2, 3, 4], 1.0, first_s=0.5),
                         Run("free chat", [5, 6], 2.0, first_s=1.0),
                         Run("free chat", [7], 1.0, first_s=1.0)])  # one token: no rate
    table = {(r["row"], r["kind"]): r for r in bench.summarise([plain, spec], KINDS)}
    assert table[("plain", "overall")]["generation_tokens_per_s"] == 4 / 2.5
    assert table[("ngram", "code editing")]["generation_tokens_per_s"] == 3 / 0.5
    assert table[("ngram", "overall")]["generation_speedup"] == (4 / 1.5) / (4 / 2.5)
    assert table[("ngram", "free chat")]["generation_speedup"] == 1.0


def test_markdown_reports_rows_kinds_costs_and_ceiling() -> None:
    rows = [Row("plain (ours)", [Run("summary", [1, 2], 1.0, passes=2, drafted=0, accepted=0)])]
    meta = {"date": "2026-11-29 21:00", "machine": "test cpu", "target": "t", "draft": None,
            "prompts": 1, "max_tokens": 8, "accel": "int4+int8",
            "verify_cost_s": {1: 0.1, 4: 0.13}, "copy_gb_s": 10.0, "weight_gb": 1.0,
            "ceiling_tps": 10.0, "plain_pct_of_ceiling": 20.0}
    text = bench.markdown(bench.summarise(rows, KINDS), meta)
    assert "| plain (ours) | 2.00 | 1.00× | – | – |" in text  # no first-token time given
    assert "Generation speedup² by prompt kind" in text
    assert "k=4: 1.30" in text and "(t(1) = 100 ms)" in text
    assert "linear layers int4+int8" in text and "20 %" in text
    assert "What auto ran" not in text  # no auto row
    per_pass = text.split("Tokens per pass by prompt kind")[1]
    assert per_pass.split("\n")[4] == "| plain (ours) | 1.00 |"

    rows.append(Row("ngram", [Run("summary", [1, 2, 3], 1.0, passes=2, drafted=2, accepted=1)]))
    text = bench.markdown(bench.summarise(rows, KINDS), meta)
    assert "| ngram | 1.50 |" in text.split("Tokens per pass by prompt kind")[1]
    rows.pop()

    rows.append(Row("auto (the default)", [Run("summary", [1, 2], 1.0, method="suffix")]))
    text = bench.markdown(bench.summarise(rows, KINDS), meta)
    assert "What auto ran, per prompt: summary: suffix." in text
    assert "A trial is" not in text
    rows[0].runs.append(Run("summary", [1, 2], 1.0))
    rows[-1].runs.append(Run("summary", [1, 2], 1.0, method="hybrid", trial=True))
    text = bench.markdown(bench.summarise(rows, KINDS), meta)
    assert "What auto ran, per prompt: summary: suffix, hybrid (a trial)." in text
    assert "A trial is a runner-up" in text


def test_the_ceiling_is_the_read_rate_against_plain_after_the_first_token() -> None:
    meta = {"copy_gb_s": 30.0, "weight_gb": 1.0, "ceiling_tps": 30.0,
            "plain_pct_of_ceiling": 50.0}
    old = bench.ceiling_line(meta)  # a run from before the read rate: its copy figures
    assert "30.0 GB/s copy" in old and "reaches 50 %" in old
    meta |= {"read_gb_s": 20.0, "read_ceiling_tps": 20.0, "plain_generation_tps": 17.0,
             "plain_generation_pct_of_read": 85.0}
    line = bench.ceiling_line(meta)
    assert "reading 20.0 GB/s" in line and "= 20.00 tok/s" in line
    assert "after the first token (17.00 tok/s) reaches 85 %" in line
    assert "a copy moves 30.0 GB/s" in line
    meta["plain_generation_tps"] = meta["plain_generation_pct_of_read"] = None
    assert "reaches" not in bench.ceiling_line(meta)  # no first-token times: no share


def test_read_bandwidth_counts_the_bytes_read_once(monkeypatch: pytest.MonkeyPatch) -> None:
    ticks = iter(0.5 * i for i in range(10))  # every reading of the clock: half a second on
    monkeypatch.setattr(bench.time, "perf_counter", lambda: next(ticks))
    assert bench.read_bandwidth(megabytes=1) == (1 << 20) / 0.5  # 1 MiB in each half second


def test_weight_bytes_count_quantized_buffers_and_skip_an_untied_embedding() -> None:
    model = tiny_loaded(dtype=torch.float32).model
    embedding = model.get_input_embeddings().weight
    dense = bench.weight_bytes_per_token(model)
    every = model_bytes(model)  # parameters and buffers (the rotary table too)
    assert dense == every - embedding.numel() * embedding.element_size()
    head = model.lm_head
    model.lm_head = Int8Linear.from_weight(head.weight)
    int8 = bench.weight_bytes_per_token(model)
    saved = head.weight.numel() * 4 - (head.weight.numel() + head.out_features * 2)
    assert int8 == dense - saved


def test_the_cpu_name_tells_generations_apart_by_family_and_model() -> None:
    zen1 = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 23\nmodel\t\t: 1\n" \
        "model name\t: AMD EPYC\nflags\t\t: fpu avx2\nprocessor\t: 1\ncpu family\t: 99\n"
    zen3 = zen1.replace("cpu family\t: 23", "cpu family\t: 25")
    assert bench.cpu_name(zen1) == "AMD EPYC (family 23 model 1)"  # the first processor's
    assert bench.cpu_name(zen3) == "AMD EPYC (family 25 model 1)"
    assert bench.cpu_name("model name\t: Some CPU\n") == "Some CPU"
    assert bench.cpu_name("") != ""
    assert bench.machine().startswith(bench.cpu_name())


def test_tiny_run_fills_every_row_and_greedy_rows_match_plain() -> None:
    engine = ChatEngine(tiny_loaded(seed=1, scale=8.0), tiny_loaded(seed=1, scale=8.0))
    prompts = [{"kind": "code editing", "prompt": "abc abc abc abc"},
               {"kind": "free chat", "prompt": "hello there"}]
    specs = bench.row_specs(engine, 2, 12)
    names = [name for name, _ in specs]
    assert names[0] == "plain (ours)" and "draft k=2" in names and "suffix adaptive" in names
    assert "auto (the default)" in names  # the worker's default method, chosen per answer
    assert "transformers assisted (draft model)" in names and "transformers prompt lookup" in names
    rows = bench.run_rows(engine, specs, prompts)
    plain = rows[0].runs
    for row in rows:
        assert len(row.runs) == 2 and row.peak_rss > 0
        for run, base in zip(row.runs, plain, strict=True):
            assert run.tokens == base.tokens, row.name
            assert run.seconds > 0 and run.passes
            assert run.first_s is not None and 0 < run.first_s <= run.seconds, row.name
    draft = next(r for r in rows if r.name == "draft k=2")
    assert sum(r.accepted or 0 for r in draft.runs) > 0  # the draft is the target itself
    auto = next(r for r in rows if r.name.startswith("auto"))
    assert all(r.method in engine.drafters for r in auto.runs)  # what auto ran, by name
    assert {r.method for r in draft.runs} == {"draft"}


def test_warm_ups_teach_the_engine_nothing_and_the_run_is_recorded_apart() -> None:
    engine = ChatEngine(tiny_loaded(seed=1, scale=8.0), None)
    for _ in engine.calibrate(None, budget_s=0.0):
        pass
    prior = Seen(accepted=5.0, rejected=1.0, asked=3.0, found=3.0, answers=4.0)
    engine.observations.record("ngram", "code", prior, 10, 20)  # as shipped priors would
    recorded = bench.Recorded(engine.observations.seen, engine.observations.lengths)
    engine.observations = recorded
    calibration = engine.calibration
    assert calibration is not None
    specs = [s for s in bench.row_specs(engine, 2, 8) if s[0] in ("plain (ours)",
                                                                  "suffix adaptive")]
    bench.run_rows(engine, specs, [{"kind": "free chat", "prompt": "abc abc abc abc"},
                                   {"kind": "code editing", "prompt": "abc abc abc abc"}])
    assert engine.observations is recorded
    # one measured answer of suffix per kind: the warm-up call (on chat) left no trace
    assert engine.observations.seen["suffix"]["chat"].answers == 1.0
    assert engine.observations.seen["suffix"]["editing"].answers == 1.0
    assert engine.calibration is not None and engine.calibration.answers == 4  # 2 off, 2 suffix
    assert engine.observations.seen["ngram"]["code"] == prior  # auto chose from the priors
    assert set(recorded.run.seen) == {"suffix"}  # the file gets this run's answers only
    assert {k: s.answers for k, s in recorded.run.seen["suffix"].items()} == {
        "chat": 1.0, "editing": 1.0}


def test_llama_cpp_rows_are_checked_against_llama_cpp_plain() -> None:
    ours = Row("plain (ours)", [Run("summary", [1, 2, 3], 1.0)])
    cpp = Row("llama.cpp plain", [Run("summary", [1, 2, 4], 0.5)])
    lookup = Row("llama.cpp prompt lookup k=3", [Run("summary", [1, 2, 4], 0.25)])
    table = {r["row"]: r for r in bench.summarise([ours, cpp, lookup], KINDS)
             if r["kind"] == "overall"}
    assert table["llama.cpp plain"]["identical"] is None  # its own reference, not ours
    assert table["llama.cpp prompt lookup k=3"]["identical"] == "1/1"
    assert table["llama.cpp prompt lookup k=3"]["speedup"] == 4.0  # speed is always vs ours


class PrefixReusingLlama:
    """llama-cpp-python's ``generate`` as it behaves: the ids a prompt shares with the
    previous one's cache are not read again, even with ``reset=True``; ``reset()`` empties
    the cache. Records how many ids each call read and answers two fixed tokens."""

    def __init__(self) -> None:
        self.cached: list[int] = []
        self.read: list[int] = []

    def reset(self) -> None:
        self.cached = []

    def generate(self, ids: list[int], **_: Any) -> Iterator[int]:
        shared = 0
        while shared < min(len(ids), len(self.cached)) and ids[shared] == self.cached[shared]:
            shared += 1
        self.read.append(len(ids) - shared)
        self.cached = list(ids)
        yield from (7, 8)


def test_llama_cpp_reads_every_prompt_whole_as_our_rows_do() -> None:
    llm = PrefixReusingLlama()
    template = list(range(30))  # the chat template and system prompt every prompt shares
    for question in ([100, 101], [200, 201, 202]):
        run = bench.run_llama_cpp(llm, template + question, "free chat", frozenset({8}), 16)
        assert run.tokens == [7] and run.first_s is not None
    assert llm.read == [32, 33]  # without the reset the second would read only its 3 ids


def test_the_prompt_reading_line_compares_first_tokens_with_llama_cpp() -> None:
    ours = Row("plain (ours)", [Run("summary", [1, 2], 2.0, first_s=1.0),
                                Run("free chat", [3, 4], 1.0, first_s=0.5)])
    cpp = Row("llama.cpp plain", [Run("summary", [1, 2], 3.0, first_s=1.5),
                                  Run("free chat", [3, 4], 1.0, first_s=0.75)])
    line = bench.prompt_reading_line(bench.summarise([ours, cpp], KINDS))
    assert line is not None
    assert "plain (ours) 1.50 s" in line and "llama.cpp plain 2.25 s" in line
    assert "our rate 1.50× llama.cpp's" in line
    assert bench.prompt_reading_line(bench.summarise([ours], KINDS)) is None  # no peer
    untimed = Row("llama.cpp plain", [Run("summary", [1, 2], 3.0), Run("free chat", [3], 1.0)])
    assert bench.prompt_reading_line(bench.summarise([ours, untimed], KINDS)) is None


def test_the_stock_row_has_no_identity_claim_but_a_speedup() -> None:
    ours = Row("plain (ours)", [Run("summary", [1, 2, 3], 1.0)])
    stock = Row(bench.STOCK, [Run("summary", [1, 2, 5], 3.0)])
    table = {r["row"]: r for r in bench.summarise([ours, stock], KINDS) if r["kind"] == "overall"}
    assert table["plain (ours)"]["identical"] == "1/1"
    assert table[bench.STOCK]["identical"] is None and table[bench.STOCK]["speedup"] == 1 / 3


def test_rows_rotate_per_prompt_and_keep_their_own_suffix_corpus() -> None:
    assert [bench.rotation(3, i) for i in range(4)] == [[0, 1, 2], [1, 2, 0], [2, 0, 1],
                                                        [0, 1, 2]]
    engine = ChatEngine(tiny_loaded(seed=2, scale=8.0))
    prompts = [{"kind": "code editing", "prompt": "abc abc abc abc"},
               {"kind": "free chat", "prompt": "abc abc abc abc"}]
    seen: list[tuple[str, int]] = []

    def row(name: str) -> bench.RowSpec:
        def run(e: ChatEngine, ids: list[int], kind: str) -> bench.Run:
            seen.append((name, len(e.drafters["suffix"].index.docs)))  # type: ignore[attr-defined]
            return bench.run_ours(e, ids, kind, "suffix", 2, 6)
        return name, run

    rows = bench.run_rows(engine, [row("a"), row("b")], prompts)
    assert [len(r.runs) for r in rows] == [2, 2]
    # warm-ups, then prompt 0 in order a, b and prompt 1 in order b, a; each row's corpus
    # holds only its own earlier answers
    assert seen == [("a", 0), ("b", 0), ("a", 0), ("b", 0), ("b", 1), ("a", 1)]


def test_tree_rows_verify_trees(monkeypatch: pytest.MonkeyPatch) -> None:
    target = tiny_loaded(seed=1, scale=8.0, dtype=torch.float32)
    accelerate(target.model, None, "fp32")
    engine = ChatEngine(target, tiny_loaded(seed=2, scale=8.0, dtype=torch.float32))
    monkeypatch.setattr(engine.drafters["draft"], "min_branch", 0.0)
    trees = []
    verify = engine.runner.forward_tree
    monkeypatch.setattr(engine.runner, "forward_tree",
                        lambda ids, parents: trees.append(parents) or verify(ids, parents))
    wanted = ("plain (ours)", "draft tree k=2")
    specs = [s for s in bench.row_specs(engine, 2, 10) if s[0] in wanted]
    assert len(specs) == 2
    rows = bench.run_rows(engine, specs, [{"kind": "free chat", "prompt": "hello there"}])
    assert rows[1].runs[0].tokens == rows[0].runs[0].tokens
    assert trees and all(len(t) > 2 for t in trees)  # it verified trees with branches
    assert engine.drafters["draft"].branches == 0  # only that row branched


def test_verification_costs_time_every_size_and_leave_the_engine_cache_alone() -> None:
    engine = ChatEngine(tiny_loaded(seed=1), None)
    engine.runner.sync([5, 6, 7])
    costs = bench.verification_costs(engine, ks=(1, 2, 4), reps=3)
    assert sorted(costs) == [1, 2, 4] and all(c > 0 for c in costs.values())
    assert engine.runner.ids == [5, 6, 7]


def test_a_block_shorter_than_the_sampling_interval_still_gets_its_rss() -> None:
    row = Row("quick")
    with bench.peak_rss(row):
        pass
    assert row.peak_rss > 0


def test_the_kernel_variants_a_b_reports_every_variant_and_row_count() -> None:
    names = kernels.buildable()
    if not names:
        pytest.skip("native kernels need AVX2, FMA, F16C and a C++ compiler")
    rates = bench.kernel_throughput(names, rows=(1, 3), n=32, k=512, reps=1)
    assert set(rates) == set(names) and all(set(by) == {1, 3} for by in rates.values())
    assert all(r > 0 for by in rates.values() for r in by.values())
    assert kernels.variant() == names[-1]  # the forced variants are undone
    costs: dict[str, dict[str, dict[str, Any]]] = {
        "m": {v: {"t": {1: 0.01, 2: 0.012}, "prompt_ms_per_token": 3.0} for v in names}}
    text = bench.variants_markdown(rates, costs)
    assert all(f"| {v} |" in text for v in names) and "| 1.20 | – | 3.00 | – |" in text
    costs["m"][bench.LLAMA_CPP] = {"t": {1: 0.0105}, "prompt_ms_per_token": 4.5}
    text = bench.variants_markdown(rates, costs)  # its decoding and reading beside ours
    assert "| 1.20 | 1.05 | 3.00 | 1.50 |" in text and "| llama.cpp | 10.5 | – | 1.00 |" in text


def test_the_peer_decodes_one_token_after_each_of_its_reads_and_is_reported() -> None:
    names = kernels.buildable()
    if not names:
        pytest.skip("native kernels need AVX2, FMA, F16C and a C++ compiler")
    calls: list[tuple[str, int]] = []
    peer = bench.Peer(read=lambda ids: calls.append(("read", len(ids))),
                      step=lambda token: calls.append(("step", token)))
    loaded = tiny_loaded("tiny-a", seed=1, scale=8.0, layers=2)
    costs = bench.variant_costs(ModelRunner(loaded.model), names[-1:], ks=(1, 2), prompt=8,
                                reps=3, peer=peer)
    assert [c[0] for c in calls] == ["read", "step"] * 4 and calls[0] == ("read", 8)
    assert set(costs[bench.LLAMA_CPP]["t"]) == {1} and costs[bench.LLAMA_CPP]["t"][1] >= 0
    assert set(costs[names[-1]]["t"]) == {1, 2}


def test_head_rows_draft_with_the_other_head_and_give_the_engines_back(tmp_path: Path) -> None:
    loaded = tiny_loaded("tiny-a", seed=1, scale=8.0, layers=4)
    own = save_head(random_head(loaded.model, seed=1), head_info(loaded.model, "tiny-a"),
                    tmp_path / "own.safetensors")
    engine = ChatEngine(loaded, head=own)
    fused = EagleHead(HeadConfig.for_target(loaded.model.config, 32, (0, 1), fuse_rank=8))
    other_file = save_head(fused.to(loaded.model.dtype),
                           HeadInfo("tiny-a", None, int(loaded.model.config.vocab_size),
                                    fused.config, 99), tmp_path / "other.safetensors")
    other = eagle_for(loaded, other_file)
    assert other is not None
    specs = [s for s in bench.row_specs(engine, 2, 10) if s[0] == "plain (ours)"]
    specs += bench.head_specs(other, 2, 10)
    assert [name for name, _ in specs[1:]] == ["eagle k=2 [other.safetensors]",
                                               "eagle adaptive [other.safetensors]",
                                               "eagle tree k=2 [other.safetensors]",
                                               "hybrid-eagle adaptive [other.safetensors]"]
    branches = other.branches
    mine = engine.drafters["eagle"]
    seen, branchings = [], set()
    original = other.observe_hidden

    def observe(f: torch.Tensor | None) -> None:
        seen.append(f)
        branchings.add(other.branches)  # the tree row drafts with its branches set
        original(f)

    other.observe_hidden = observe  # type: ignore[method-assign]
    recorded = bench.Recorded(engine.observations.seen, engine.observations.lengths)
    engine.observations = recorded
    steps = {"eagle": 0.05, "hybrid-eagle": 0.01}
    engine.calibration = Calibration("k", 0.05, {2: 1.1}, steps)
    rows = bench.run_rows(engine, specs, [{"kind": "free chat", "prompt": "hello there"}])
    assert engine.observations is recorded
    assert engine.calibration is not None and engine.calibration.step == steps
    assert "eagle" not in recorded.seen and "hybrid-eagle" not in recorded.seen
    assert recorded.run.seen == {}  # the other head's answers are not this engine's
    assert all(r.runs[0].tokens == rows[0].runs[0].tokens for r in rows)
    assert seen and all(f is not None and f.shape[-1] == 3 * 64 for f in seen)
    assert engine.drafters["eagle"] is mine and other.branches == branches
    assert branchings == {branches, bench.TREE_BRANCHES} and branches != bench.TREE_BRANCHES
    meta = {"date": "d", "machine": "m", "target": "t", "draft": None, "prompts": 1,
            "max_tokens": 8, "accel": "a", "head": mine.info, "compared_head": other.info,
            "verify_cost_s": {1: 0.1}, "copy_gb_s": 10.0, "weight_gb": 1.0, "ceiling_tps": 10.0,
            "plain_pct_of_ceiling": 20.0}
    text = bench.markdown(bench.summarise(rows, KINDS), meta)
    assert "EAGLE head (rows `eagle …`): EAGLE-1 own.safetensors" in text
    assert ("Compared head (rows `eagle … [file]`): EAGLE-3 other.safetensors, fusing layers "
            "1, 2 + last, 99 training tokens") in text
