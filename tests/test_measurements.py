"""docs/measurements.md's index of runs is generated from docs/bench/*.json and kept in
step with them (engine/tools/measurements.py)."""

import json
from pathlib import Path

import pytest

from engine.tools import measurements
from engine.tools.measurements import BEGIN, END, MeasurementsError, render, runs

DOC = f"# Measurements\n\nhand-written\n\n{BEGIN}\nold\n{END}\n\n## Dated notes\n"


def load_run(folder: Path, name: str, identical: bool = True) -> None:
    meta = {"date": "2026-12-02 05:00", "machine": "AMD EPYC, 2 threads",
            "cpu_flags": ["avx2", "fma"], "command": "python -m engine.bench --concurrency 1,4"}
    levels = [{"concurrency": c, "mode": m, "total_tokens_per_s": t, "vs_one_plain": r,
               "worst_first_token_s": f, "identical": identical}
              for c, m, t, r, f in [(1, "off", 10.0, 1.0, 0.2), (4, "on", 31.5, 3.15, 0.9)]]
    (folder / name).write_text(json.dumps({"meta": meta, "slots": 4, "levels": levels}))


def test_the_docs_index_is_up_to_date_with_the_shipped_runs() -> None:
    assert measurements.main(["--check"]) == 0, (
        "docs/measurements.md is out of date: run python -m engine.tools.measurements")


def test_a_run_becomes_one_line_between_the_markers_and_the_rest_stays(tmp_path: Path) -> None:
    load_run(tmp_path, "load-appliance-20261202-0500.json", identical=False)
    (tmp_path / "notes.json").write_text("{}")  # not a run: left out
    out = render(DOC, tmp_path)
    assert out.startswith("# Measurements\n\nhand-written\n") and out.endswith("## Dated notes\n")
    body = out[out.index(BEGIN) + len(BEGIN): out.index(END)].strip().splitlines()
    assert len(body) == 1
    line = body[0]
    assert "several answers at once" in line and "AMD EPYC, 2 threads (avx2 fma)" in line
    assert "`python -m engine.bench --concurrency 1,4`" in line
    assert "4 on: 31.5 tok/s (3.15× one plain), first token ≤ 0.90 s, NOT identical" in line
    assert "(bench/load-appliance-20261202-0500.md)" in line
    assert render(out, tmp_path) == out  # regenerating changes nothing


def test_a_kernel_a_b_line_gives_each_variant_against_llama_cpp_where_it_ran(
    tmp_path: Path,
) -> None:
    meta = {"date": "2026-12-07 15:00", "machine": "AMD EPYC, 2 threads", "cpu_flags": ["avx2"],
            "command": "python -m engine.bench --kernels-only"}
    ours = {"t": {"1": 0.030, "4": 0.048, "8": 0.075}, "prompt_ms_per_token": 8.0}
    peer = {"t": {"1": 0.033}, "prompt_ms_per_token": 10.0}
    old_peer = {"t": {}, "prompt_ms_per_token": 10.0}  # runs before the peer decoded
    for name, llama in (("kernels-appliance-20261207-1500.json", peer),
                        ("kernels-appliance-20261207-1400.json", old_peer)):
        (tmp_path / name).write_text(json.dumps({
            "meta": meta, "running": "avx512", "kernel_gmac_s": {},
            "models": {"m": {"avx512": ours, "llama.cpp": llama}}}))
    lines = render(DOC, tmp_path).splitlines()
    new = next(line for line in lines if line.startswith("  - m:") and "decoding" in line)
    assert new == ("  - m: avx512 t(1) 30.0 ms, t(4)/t(1) t(8)/t(1) 1.60 2.50, decoding 1.10× "
                   "llama.cpp, prompt 1.25× llama.cpp")
    assert sum(line.startswith("  - m: avx512 t(1) 30.0 ms, t(4)/t(1) t(8)/t(1) 1.60 2.50, "
                               "prompt 1.25×") for line in lines) == 1


def test_a_held_out_check_gets_its_line(tmp_path: Path) -> None:
    meta = {"date": "2026-12-03 22:00", "machine": "AMD EPYC, 2 threads", "cpu_flags": ["avx2"],
            "command": "python -m engine.tools.heldout --rounds 2", "prompts": 8, "rounds": 2,
            "max_tokens": 256}
    summary = [{"method": "auto", "overall": 1.25, "kinds": {"summary": 1.8, "free chat": 0.97},
                "lowest": 0.91, "lowest_kind": "free chat", "lowest_ran": "hybrid",
                "identical": 16, "pairs": 16, "ran": {"hybrid-eagle": 10, "ngram": 6}}]
    (tmp_path / "heldout-appliance-20261203-2200.json").write_text(
        json.dumps({"meta": meta, "summary": summary, "pairs": []}))
    (line,) = runs(tmp_path)
    assert line.startswith("- **held-out check**, 2026-12-03 22:00 · AMD EPYC, 2 threads (avx2)")
    assert ("8 prompts × 2 round(s), ≤256 new tokens; auto 1.25× (summary 1.80×, free chat "
            "0.97×; lowest pair 0.91×, free chat, ran hybrid); identical 16/16; ran "
            "hybrid-eagle ×10, ngram ×6") in line
    assert "(bench/heldout-appliance-20261203-2200.md)" in line


def test_a_benchmark_run_gets_its_line_and_the_read_share_where_measured(
        tmp_path: Path) -> None:
    meta = {"date": "2026-12-04 03:00", "machine": "AMD EPYC, 2 threads", "cpu_flags": ["avx2"],
            "command": "python -m engine.bench --per-kind 4", "prompts": 16, "max_tokens": 128,
            "kernels": "avx2", "verify_cost_s": {"1": 0.05, "4": 0.0875, "8": 0.15}}
    summary = [{"row": "plain (ours)", "kind": "overall", "speedup": 1.0, "tokens_per_s": 12.5,
                "identical": "16/16"},
               {"row": "auto (the default)", "kind": "overall", "speedup": 1.24,
                "tokens_per_s": 15.5, "identical": "16/16"},
               {"row": "auto (the default)", "kind": "summary", "speedup": 1.33,
                "tokens_per_s": 16.0, "identical": "4/4"}]
    path = tmp_path / "bench-appliance-20261204-0300.json"
    path.write_text(json.dumps({"meta": meta, "summary": summary, "rows": []}))
    (line,) = runs(tmp_path)
    assert ("16 prompts, ≤128 new tokens, kernels avx2; plain (ours) 12.50 tok/s; auto (the "
            "default) 1.24×; t(4)/t(1) 1.75, t(8)/t(1) 3.00; identical 16/16") in line
    meta["plain_generation_pct_of_read"] = 68.4  # runs since the read rate was measured
    path.write_text(json.dumps({"meta": meta, "summary": summary, "rows": []}))
    (line,) = runs(tmp_path)
    assert "plain (ours) 12.50 tok/s (68 % of the read ceiling after the first token);" in line
    assert "llama.cpp" not in line  # no llama.cpp row
    summary += [{"row": "llama.cpp plain", "kind": "overall", "speedup": 0.8,
                 "tokens_per_s": 10.0, "identical": None, "first_token_s": 15.0}]
    summary[0]["first_token_s"] = 10.0  # runs since the benchmark sums first-token times
    path.write_text(json.dumps({"meta": meta, "summary": summary, "rows": []}))
    (line,) = runs(tmp_path)
    assert "llama.cpp plain 0.80×; t(4)/t(1) 1.75, t(8)/t(1) 3.00; prompt reading 1.50× " \
        "llama.cpp's; identical 16/16" in line


def test_check_fails_on_a_stale_index_and_writing_fixes_it(tmp_path: Path) -> None:
    doc = tmp_path / "measurements.md"
    doc.write_text(DOC)
    load_run(tmp_path, "load-light-20261202-0501.json")
    args = ["--docs", str(doc), "--runs", str(tmp_path)]
    assert measurements.main([*args, "--check"]) == 1 and doc.read_text() == DOC
    assert measurements.main(args) == 0
    assert measurements.main([*args, "--check"]) == 0 and "31.5 tok/s" in doc.read_text()


def test_bad_inputs_say_what_is_wrong_and_write_nothing(tmp_path: Path) -> None:
    with pytest.raises(MeasurementsError, match="lacks the markers"):
        render("# no markers\n", tmp_path)
    with pytest.raises(MeasurementsError, match="no runs folder"):
        runs(tmp_path / "missing")
    (tmp_path / "bench-x.json").write_text("{not json")
    with pytest.raises(MeasurementsError, match=r"bench-x\.json: not a benchmark run"):
        runs(tmp_path)
    doc = tmp_path / "m.md"
    doc.write_text(DOC)
    assert measurements.main(["--docs", str(doc), "--runs", str(tmp_path)]) == 2
    assert doc.read_text() == DOC
