"""Benchmark: our decoding methods against plain decoding and transformers' own.

``python -m engine.bench`` runs, in one process, on the same models and prompts
(``assets/bench/prompts.json``: code completion, code editing, summaries quoting a
document, free chat; chat template applied, greedy, up to 128 new tokens):

* plain decoding (our loop, no drafter) — the baseline every speedup is against;
* ``auto``, the worker's default: per answer the method the machine's calibration and
  the acceptance observed so far predict fastest for the question's kind (the engine is
  calibrated first, as a worker is at start);
* each of our drafters with a fixed draft length and with the adaptive policy, and the
  draft model and EAGLE head drafting small trees (their chain plus likely
  alternatives, :mod:`engine.spec.drafters.tree`) verified in one pass;
* transformers' ``generate(assistant_model=...)`` and ``generate(prompt_lookup_num_tokens=...)``;
* when ``llama-cpp-python`` is installed, llama.cpp on the same GGUF file (plain, and
  its prompt-lookup drafting), with our token ids as its prompt.

Columns: tokens/s (completion tokens / wall time including the prompt), speedup over
our plain decoding, the same two after each answer's first token (generation alone,
as llama.cpp reports its "eval" rate), acceptance rate, mean tokens per target pass,
whether the token ids equal plain decoding's, and peak RSS. Also the verification cost ``t(k)/t(1)``
of a target forward over ``k`` tokens with a warm cache, and the memory-bandwidth
ceiling (read bandwidth / bytes of weights read per token) beside plain decoding's rate
after the first token, and a copy's bandwidth. Where llama.cpp plain ran, our plain
decoding's summed time to the first tokens against its (every row reads each prompt from
an empty cache): the prompt-reading rate. What ``auto`` ran per prompt, its one-time
trials of a runner-up marked. ``--quick`` uses the light profile and four prompts.
Results go to a JSON file and a Markdown table.

Native kernel variants (:mod:`engine.cpu.kernels`): the header names the one that runs;
``--variants`` adds plain decoding under every other variant this CPU runs (rows
``plain [avx2]`` ...) and an A/B in the same process, variants taking turns: the q4k
kernel's GMAC/s on a 1536x8960 matrix at 1, 2, 4, 8 and 16 rows
(:func:`kernel_throughput`), and per variant the target's t(k)/t(1) and prompt
reading ms/token (:func:`variant_costs`). ``python -m engine.bench --kernels-only``
runs that A/B alone.

``--concurrency 1,2,4`` runs the load benchmark instead (:mod:`engine.tools.load`):
several answers at once through the worker's scheduler, speculation off and on, total
and per-answer tokens per second, time to first token, identical answers.

``--observations-out FILE`` writes what this run's answers showed per method and kind in
the format ``assets/calibration/`` ships: a fresh engine starts its ``auto`` choice from
it (:func:`engine.spec.calibration.shipped_observations`). The ``auto`` row starts from the
shipped file, as a fresh worker does (with or without ``--observations-out``), so on the
benchmark's own prompts it is measured in-sample; the held-out check through the API is
the fair one. The rows' warm-up calls teach the engine nothing: its observations and
calibration are put back after them.

Rows run interleaved: prompt by prompt, every row in an order that rotates by one per
prompt, so a slow spell of the (shared, noisy) machine falls on all rows alike. Each
row keeps its own adaptive policies and suffix corpus from prompt to prompt.

Every row runs on the same loaded models, so the peers' rows use our fast linear
layers too (``--accel``, default ``auto``: the GGUF's int4 codes) and the comparison
is between decoding algorithms on the same weights. ``--accel off`` measures the
stock transformers layers. The fixed draft length defaults to what one cheap
verification holds on the loaded kernels (3 on int4, else 4); transformers' prompt
lookup gets the same length.
"""

import argparse
import copy
import importlib.util
import json
import logging
import os
import platform
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
import torch

from engine.cpu import kernels
from engine.cpu.layers import Q4KLinear
from engine.cpu.quantize import model_bytes
from engine.models.registry import PROFILES
from engine.paths import ASSETS
from engine.protocol import ACCELERATIONS, Completion
from engine.spec.calibration import PRIOR_FORMAT, Observations, Seen, cpu_fields
from engine.spec.drafters.eagle import eagle_for
from engine.spec.drafters.suffix import SuffixDrafter
from engine.spec.policy import Policy
from engine.spec.runner import ModelRunner
from engine.spec.session import ADAPTIVE, AUTO, ChatEngine, DraftLength, PolicyKey
from engine.tools.load import check_rounds, load_markdown, parse_levels, run_load

log = logging.getLogger(__name__)

PROMPTS = ASSETS / "bench" / "prompts.json"
KINDS = ("code completion", "code editing", "summary", "free chat")


@dataclass
class Run:
    """One prompt under one row."""

    kind: str
    tokens: list[int]
    seconds: float
    passes: int | None = None
    drafted: int | None = None
    accepted: int | None = None
    auto_off: int = 0
    first_s: float | None = None  # seconds to the first new token (prompt included)
    method: str | None = None  # the method that ran (what auto chose, for auto)
    trial: bool = False  # auto ran a runner-up not yet timed here (Choice.trial)

    @property
    def generation_s(self) -> float:
        """Seconds after the first new token: what the remaining tokens took."""
        return self.seconds - (self.first_s if self.first_s is not None else self.seconds)


@dataclass
class Row:
    name: str
    runs: list[Run] = field(default_factory=list)
    peak_rss: int = 0


def load_prompts(path: Path, per_kind: int) -> list[dict[str, str]]:
    prompts = json.loads(path.read_text())["prompts"]
    chosen = []
    for kind in KINDS:
        chosen += [p for p in prompts if p["kind"] == kind][:per_kind]
    return chosen


@contextmanager
def peak_rss(row: Row) -> Iterator[None]:
    """Sample this process's RSS every 20 ms while the block runs, and at its end (a
    block shorter than 20 ms gets a sample too)."""
    proc, done = psutil.Process(), threading.Event()

    def sample() -> None:
        while not done.wait(0.02):
            row.peak_rss = max(row.peak_rss, proc.memory_info().rss)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        row.peak_rss = max(row.peak_rss, proc.memory_info().rss)


@dataclass
class RowState:
    """What one row carries from prompt to prompt: its policies and suffix corpus only."""

    policies: dict[PolicyKey, Policy] = field(default_factory=dict)
    suffix: SuffixDrafter = field(default_factory=SuffixDrafter)


def enter(engine: ChatEngine, state: RowState) -> None:
    """Give the engine this row's state, with fresh caches (no other row's traces)."""
    engine.runner.reset()
    engine.policies = state.policies
    engine.drafters["suffix"] = state.suffix
    for drafter in engine.drafters.values():
        drafter.reset()  # drafters with a cache of their own


# The kind of question (engine.spec.calibration.classify) of each benchmark kind: what the
# worker's classify gives on these prompts (tested), passed so that auto chooses and every
# row's answers are observed per kind as a worker's would be.
QUESTION_KINDS = {"code completion": "code", "code editing": "editing", "summary": "summary",
                  "free chat": "chat"}


def run_ours(engine: ChatEngine, ids: list[int], kind: str, method: str, k: DraftLength,
             max_tokens: int) -> Run:
    engine.runner.reset()
    *_, done = engine.generate_ids(ids, max_tokens=max_tokens, method=method, num_draft_tokens=k,
                                   kind=QUESTION_KINDS.get(kind))
    assert isinstance(done, Completion)
    s = done.stats
    choice = engine.last_choice if method == AUTO else None
    return Run(kind, list(done.token_ids), s.total_s, s.passes, s.drafted, s.accepted,
               s.auto_off_passes, s.time_to_first_token_s,
               choice.method if choice else method, choice is not None and choice.trial)


def run_transformers(engine: ChatEngine, ids: list[int], kind: str, mode: str,
                     max_tokens: int, k: int) -> Run:
    """transformers' generate() with its own assisted generation or prompt lookup."""
    model = engine.target.model
    calls = [0]
    hook = model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    extra: dict[str, Any] = (
        {"assistant_model": engine.draft.model} if mode == "assisted" and engine.draft
        else {"prompt_lookup_num_tokens": k}
    )
    x = torch.tensor([ids])
    first = FirstTokenClock()
    try:
        with torch.inference_mode():
            out = model.generate(
                x, attention_mask=torch.ones_like(x), max_new_tokens=max_tokens, do_sample=False,
                eos_token_id=sorted(engine.target.eos_ids),
                pad_token_id=engine.target.tokenizer.pad_token_id or 0, streamer=first, **extra,
            )
    finally:
        hook.remove()
    seconds = time.perf_counter() - first.start
    tokens = [int(t) for t in out[0, len(ids):]]
    while tokens and tokens[-1] in engine.target.eos_ids:
        tokens.pop()
    return Run(kind, tokens, seconds, passes=calls[0], first_s=first.first_s)


class FirstTokenClock:
    """A ``generate(streamer=...)`` that notes when the first new token arrives (the
    streamer gets the prompt first, then the new tokens)."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.calls = 0
        self.first_s: float | None = None

    def put(self, value: torch.Tensor) -> None:
        self.calls += 1
        if self.calls == 2:
            self.first_s = time.perf_counter() - self.start

    def end(self) -> None:
        pass


def run_llama_cpp(llm: Any, ids: list[int], kind: str, eos_ids: frozenset[int],
                  max_tokens: int) -> Run:
    """llama.cpp's own greedy generation (``temp=0``) on our prompt's token ids, read from
    an empty cache as our rows read theirs: llama-cpp-python's ``generate`` would otherwise
    keep the previous prompt's cache for the ids the two share (even with ``reset=True``),
    so the shared chat template and system prompt would not be read again."""
    tokens: list[int] = []
    start = time.perf_counter()
    llm.reset()
    first_s = None
    for token in llm.generate(ids, temp=0.0, top_k=1, repeat_penalty=1.0, reset=True):
        first_s = time.perf_counter() - start if first_s is None else first_s
        if token in eos_ids:
            break
        tokens.append(int(token))
        if len(tokens) >= max_tokens:
            break
    return Run(kind, tokens, time.perf_counter() - start, first_s=first_s)


def llama_cpp_specs(engine: ChatEngine, k: int, max_tokens: int) -> list["RowSpec"]:
    """llama.cpp rows on the target's GGUF, or none (with the reason logged)."""
    gguf = engine.target.gguf
    if importlib.util.find_spec("llama_cpp") is None or gguf is None:
        log.info("no llama.cpp rows: %s", "llama-cpp-python is not installed"
                 if gguf else "the target was not loaded from a GGUF file")
        return []
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    def row(lookup: bool) -> Callable[[ChatEngine, list[int], str], Run]:
        loaded: list[Any] = []  # the Llama, created on the row's first (warm-up) call

        def run(e: ChatEngine, ids: list[int], kind: str) -> Run:
            if not loaded:
                draft = LlamaPromptLookupDecoding(num_pred_tokens=k) if lookup else None
                loaded.append(Llama(model_path=str(gguf), n_ctx=4096, draft_model=draft,
                                    n_threads=torch.get_num_threads(), verbose=False))
            return run_llama_cpp(loaded[0], ids, kind, e.target.eos_ids, max_tokens)

        return run

    return [(f"{LLAMA_CPP} plain", row(False)), (f"{LLAMA_CPP} prompt lookup k={k}", row(True))]


def forward_costs(runners: Sequence[tuple[ModelRunner, tuple[int, ...], bool]], reps: int = 9
                  ) -> list[dict[int, float]]:
    """Per ``(runner, ks, verify)``: median seconds of its forward over k new tokens after
    a warm 128-token cache, with the logits of all k rows (``verify``: as a verification)
    or of the last (as a catch-up).

    All sizes of all runners take turns within each repetition (after one warm-up
    round), so a slow spell of the machine falls on all of them instead of on one ratio.
    """
    vocab = min(int(runner.model.config.vocab_size) for runner, _, _ in runners)
    context = [(100 + i) % vocab for i in range(128)]
    times: list[dict[int, list[float]]] = [{k: [] for k in ks} for _, ks, _ in runners]
    for runner, _, _ in runners:
        runner.reset()
        runner.sync(context)
    for rep in range(reps + 1):
        for (runner, ks, verify), timed in zip(runners, times, strict=True):
            for k in ks:
                start = time.perf_counter()
                runner.forward([(300 + i) % vocab for i in range(k)], rows=k if verify else 1)
                if rep:
                    timed[k].append(time.perf_counter() - start)
                runner.truncate(len(context))
    return [{k: sorted(t)[reps // 2] for k, t in timed.items()} for timed in times]


def verification_costs(engine: ChatEngine, ks: tuple[int, ...] = (1, 2, 3, 4, 5, 8),
                       reps: int = 9) -> dict[int, float]:
    """Median seconds of one target forward over k new tokens (see :func:`forward_costs`)."""
    return forward_costs([(ModelRunner(engine.target.model), ks, True)], reps)[0]


@contextmanager
def kernel_variant(name: str | None) -> Iterator[None]:
    """Run the block under kernel variant ``name`` (``None``: the one running now)."""
    if name is None:
        yield
        return
    kernels.use(name)
    try:
        yield
    finally:
        kernels.use(None)


def q4k_matrix(n: int = 8960, k: int = 1536, seed: int = 0) -> Q4KLinear:
    """A random layer ``[n, k]`` in the q4k form (Qwen 1.5B's gate/up shape by default)."""
    gen = torch.Generator().manual_seed(seed)
    groups, blocks = k // kernels.GROUP, k // 256
    return Q4KLinear.from_parts(
        torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=gen),
        torch.randint(0, 64, (n, groups), dtype=torch.uint8, generator=gen),
        torch.randint(0, 64, (n, groups), dtype=torch.uint8, generator=gen),
        (torch.rand(n, blocks, generator=gen) * 1e-3).half().float(),
        (torch.rand(n, blocks, generator=gen) * 1e-3).half().float())


def kernel_throughput(variants: Sequence[str], rows: Sequence[int] = (1, 2, 4, 8, 16, 64),
                      n: int = 8960, k: int = 1536, reps: int = 15
                      ) -> dict[str, dict[int, float]]:
    """GMAC/s (multiply-adds per second / 1e9) of one q4k layer call per variant and
    row count, the median of ``reps`` calls; all variants and row counts take turns in
    each repetition (the weights stay in the caches the machine has)."""
    layer = q4k_matrix(n, k)
    inputs = {m: torch.randn(m, k) for m in rows}
    times: dict[str, dict[int, list[float]]] = {v: {m: [] for m in rows} for v in variants}
    for rep in range(reps + 1):
        for name in variants:
            with kernel_variant(name):
                for m, x in inputs.items():
                    start = time.perf_counter()
                    layer(x)
                    if rep:
                        times[name][m].append(time.perf_counter() - start)
    return {name: {m: m * n * k / sorted(t)[reps // 2] / 1e9 for m, t in by_rows.items()}
            for name, by_rows in times.items()}


@dataclass
class Peer:
    """Another engine timed beside ours on the same ids: ``read(ids)`` reads a prompt into
    an empty cache; ``step(token)`` then decodes one more token after it (its logits
    computed) and takes it back out of the cache."""

    read: Callable[[list[int]], None]
    step: Callable[[int], None]


def variant_costs(runner: ModelRunner, variants: Sequence[str],
                  ks: tuple[int, ...] = (1, 2, 4, 8), prompt: int = 128, reps: int = 5,
                  peer: Peer | None = None) -> dict[str, dict[str, Any]]:
    """Per variant: ``t`` the median seconds of a forward over k new tokens with all k
    rows' logits (as :func:`forward_costs`) and ``prompt_ms_per_token`` the median time
    of reading a ``prompt``-token prompt from an empty cache, per token; variants take
    turns within each repetition (after a warm-up round). ``peer`` (e.g. llama.cpp on
    the same ids) takes its turn too, reported as ``LLAMA_CPP``: its prompt reading and
    its ``t`` of one decoded token (the median of one step after each of its reads)."""
    vocab = int(runner.model.config.vocab_size)
    context = [(100 + i) % vocab for i in range(prompt)]
    steps: dict[str, dict[int, list[float]]] = {v: {k: [] for k in ks} for v in variants}
    reads: dict[str, list[float]] = {v: [] for v in (*variants, LLAMA_CPP)}
    peer_steps: list[float] = []
    for rep in range(reps + 1):
        if peer is not None:
            start = time.perf_counter()
            peer.read(context)
            if rep:
                reads[LLAMA_CPP].append((time.perf_counter() - start) / prompt)
            start = time.perf_counter()
            peer.step(300 % vocab)
            if rep:
                peer_steps.append(time.perf_counter() - start)
        for name in variants:
            with kernel_variant(name):
                runner.reset()
                start = time.perf_counter()
                runner.sync(context)
                if rep:
                    reads[name].append((time.perf_counter() - start) / prompt)
                for k in ks:
                    start = time.perf_counter()
                    runner.forward([(300 + i) % vocab for i in range(k)], rows=k)
                    if rep:
                        steps[name][k].append(time.perf_counter() - start)
                    runner.truncate(prompt)
    costs: dict[str, dict[str, Any]] = {
        name: {"t": {k: sorted(t)[reps // 2] for k, t in steps[name].items()},
               "prompt_ms_per_token": 1000 * sorted(reads[name])[reps // 2]}
        for name in variants}
    if peer is not None:
        read = sorted(reads[LLAMA_CPP])[reps // 2]
        costs[LLAMA_CPP] = {"t": {1: sorted(peer_steps)[reps // 2]},
                            "prompt_ms_per_token": 1000 * read}
    return costs


def llama_cpp_peer(gguf: Path | None) -> Peer | None:
    """llama.cpp on the same GGUF as a :class:`Peer` (``None`` without it)."""
    if gguf is None or importlib.util.find_spec("llama_cpp") is None:
        return None
    from llama_cpp import Llama

    llm = Llama(model_path=str(gguf), n_ctx=1024, n_batch=512,
                n_threads=torch.get_num_threads(), verbose=False)

    def read(ids: list[int]) -> None:
        llm.reset()
        llm.eval(ids)

    def step(token: int) -> None:
        held = llm.n_tokens
        llm.eval([token])
        llm.n_tokens = held  # the next eval drops the token from its cache

    return Peer(read, step)


def variants_markdown(throughput: dict[str, dict[int, float]],
                      costs: dict[str, dict[str, dict[str, Any]]]) -> str:
    """The A/B tables of :func:`kernel_throughput` and :func:`variant_costs` (per model)."""
    rows = list(next(iter(throughput.values())))
    lines = ["q4k kernel, 1536x8960, GMAC/s by rows:", "",
             "| variant | " + " | ".join(str(m) for m in rows) + " |",
             "| --- |" + " ---: |" * len(rows)]
    lines += [f"| {name} | " + " | ".join(f"{by[m]:.1f}" for m in rows) + " |"
              for name, by in throughput.items()]
    for model, by_variant in costs.items():
        ks = list(next(iter(by_variant.values()))["t"])
        peer = by_variant.get(LLAMA_CPP)  # prompt rate against llama.cpp's, where it ran
        lines += ["", f"{model}: t(k)/t(1) and prompt reading (every variant on the weight "
                  "forms loaded for the one running):", "",
                  "| variant | t(1) ms | " + " | ".join(f"t({k})/t(1)" for k in ks[1:])
                  + " | decoding rate × llama.cpp | prompt ms/token | prompt rate × llama.cpp |",
                  "| --- |" + " ---: |" * (len(ks) + 3)]
        for name, c in by_variant.items():
            t = c["t"]
            cells = [f"{t[ks[0]] * 1000:.1f}" if ks[0] in t else "–",
                     *(f"{t[k] / t[ks[0]]:.2f}" if k in t else "–" for k in ks[1:])]
            decode = (f"{peer['t'][ks[0]] / t[ks[0]]:.2f}"
                      if peer is not None and ks[0] in peer["t"] and ks[0] in t else "–")
            ratio = (f"{peer['prompt_ms_per_token'] / c['prompt_ms_per_token']:.2f}"
                     if peer is not None else "–")
            lines.append(f"| {name} | " + " | ".join(cells)
                         + f" | {decode} | {c['prompt_ms_per_token']:.2f} | {ratio} |")
    return "\n".join(lines) + "\n"


def fastest_s(op: Callable[[], object], times: int = 5) -> float:
    """The shortest of ``times`` timings of ``op()``, in seconds."""
    best = float("inf")
    for _ in range(times):
        start = time.perf_counter()
        op()
        best = min(best, time.perf_counter() - start)
    return best


def copy_bandwidth(megabytes: int = 256) -> float:
    """Bytes moved per second (read + write) copying a large buffer, best of 5."""
    src = torch.ones(megabytes << 18)  # float32: 4 bytes each
    dst = torch.empty_like(src)
    return 2 * src.numel() * 4 / fastest_s(lambda: dst.copy_(src))


def read_bandwidth(megabytes: int = 256) -> float:
    """Bytes read per second summing a large buffer, best of 5: what a decoding step does
    to the weights (it reads them and writes next to nothing), so the ceiling of plain
    decoding is this over the weight bytes per token, not a copy's rate."""
    src = torch.ones(megabytes << 18)  # float32: 4 bytes each
    return src.numel() * 4 / fastest_s(src.sum)


def ceiling_line(meta: dict[str, Any]) -> str:
    """The Markdown line comparing plain decoding with the memory-bandwidth ceiling.

    Runs since the read rate was measured compare plain's generation rate (after the
    first token: the prompt reading is compute, not a pass over the weights) with the
    read ceiling; older runs' JSON has only the copy figures, which are kept as they were."""
    if meta.get("read_gb_s") is None:
        return (f"Memory-bandwidth ceiling: {meta['copy_gb_s']:.1f} GB/s copy / "
                f"{meta['weight_gb']:.2f} GB of weights per token = {meta['ceiling_tps']:.2f} "
                f"tok/s; plain decoding reaches {meta['plain_pct_of_ceiling']:.0f} % of it.")
    line = (f"Memory-bandwidth ceiling: reading {meta['read_gb_s']:.1f} GB/s / "
            f"{meta['weight_gb']:.2f} GB of weights per token = "
            f"{meta['read_ceiling_tps']:.2f} tok/s")
    gen, share = meta.get("plain_generation_tps"), meta.get("plain_generation_pct_of_read")
    if gen is not None and share is not None:
        line += (f"; plain decoding after the first token ({gen:.2f} tok/s) reaches "
                 f"{share:.0f} % of it")
    return line + f" (a copy moves {meta['copy_gb_s']:.1f} GB/s, read and written)."


def weight_bytes_per_token(model: Any) -> int:
    """Bytes of weights one decoding step reads (the input embedding is a row gather).

    Quantized layers hold their weights as buffers, so buffers count too; a quantized
    output layer no longer shares the embedding's storage, which is then not read.
    """
    embedding = model.get_input_embeddings().weight
    tied = model.get_output_embeddings().weight.data_ptr() == embedding.data_ptr()
    total = model_bytes(model)
    return total if tied else total - embedding.numel() * embedding.element_size()


LLAMA_CPP = "llama.cpp"  # rows of this name prefix run llama.cpp's own numerics
STOCK = "plain, transformers' own layers"  # the target as transformers loads it


def reference(row: Row, rows: list[Row]) -> Row:
    """The row whose tokens ``row`` must reproduce: plain decoding of the same engine.

    Our rows and transformers' run the same loaded layers, so their reference is our
    plain decoding (the first row); llama.cpp computes differently (8-bit activations),
    so its rows are checked against llama.cpp's own plain decoding.
    """
    if row.name.startswith(LLAMA_CPP):
        return next((r for r in rows if r.name == f"{LLAMA_CPP} plain"), row)
    return row if row.name == STOCK else rows[0]


def summarise(rows: list[Row], kinds: tuple[str, ...]) -> list[dict[str, Any]]:
    """Per row and kind (and 'overall'): tok/s, speedup, acceptance, identical, RSS."""
    table = []
    for row in rows:
        ref = reference(row, rows)
        for kind in (*kinds, "overall"):
            runs = [r for r in row.runs if kind in ("overall", r.kind)]
            base = [r for r in rows[0].runs if kind in ("overall", r.kind)]
            same_as = [r for r in ref.runs if kind in ("overall", r.kind)]
            if not runs:
                continue
            tps = sum(len(r.tokens) for r in runs) / sum(r.seconds for r in runs)
            base_tps = sum(len(r.tokens) for r in base) / sum(r.seconds for r in base)
            gen, base_gen = generation_rate(runs), generation_rate(base)
            firsts = [r.first_s for r in runs]
            drafted = sum(r.drafted or 0 for r in runs)
            accepted = sum(r.accepted or 0 for r in runs)
            passes = sum(r.passes or 0 for r in runs)
            same = sum(r.tokens == b.tokens for r, b in zip(runs, same_as, strict=True))
            own = ref is row and row is not rows[0]  # nothing to compare with
            table.append({
                "row": row.name, "kind": kind, "tokens_per_s": tps, "speedup": tps / base_tps,
                "generation_tokens_per_s": gen,
                "generation_speedup": gen / base_gen if gen and base_gen else None,
                "acceptance_rate": accepted / drafted if drafted else None,
                "tokens_per_pass": sum(len(r.tokens) for r in runs) / passes if passes else None,
                "identical": None if own else f"{same}/{len(runs)}",
                "peak_rss_gb": row.peak_rss / 2**30,
                "auto_off_passes": sum(r.auto_off for r in runs),
                "methods": [r.method for r in runs],
                "trials": [r.trial for r in runs],
                # summed time to the first tokens (None where a run lacks one)
                "first_token_s": None if None in firsts else sum(f or 0.0 for f in firsts),
            })
    return table


def generation_rate(runs: list[Run]) -> float | None:
    """Tokens per second after each answer's first token (llama.cpp's "eval" rate): what
    speculation speeds up, without the target's prompt processing that every row pays
    alike (a drafter's own reading of the prompt comes after the first token: it counts)."""
    timed = [r for r in runs if r.first_s is not None and len(r.tokens) > 1]
    seconds = sum(r.generation_s for r in timed)
    return sum(len(r.tokens) - 1 for r in timed) / seconds if timed and seconds > 0 else None


def fmt(value: Any, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def head_line(info: dict[str, Any]) -> str:
    """A head as the Markdown header names it (``EagleDrafter.info``)."""
    layers = info.get("feature_layers") or []
    fused = f", fusing layers {', '.join(str(int(n) + 1) for n in layers)} + last" if layers \
        else ""
    tokens = info.get("training_tokens")
    return (f"{info.get('kind')} {info.get('file', '')}{fused}"
            + (f", {int(tokens):,} training tokens" if tokens else "")
            + (" (teacher-forced)" if info.get("teacher_forced") else "")
            + (f", {info['held_out_chain_accepted']} drafts per 4-token chain held out"
               if info.get("held_out_chain_accepted") is not None else ""))


# What "(a trial)" after a method means, in the benchmark's and the held-out check's tables.
TRIAL_NOTE = ("A trial is a runner-up predicted close to the best but not yet timed on this "
              "machine, run once per kind so that its own speed takes part in later choices.")


def ran_as(method: str | None, trial: bool) -> str:
    """The method that ran, marked where it was ``auto``'s one-time trial of a runner-up."""
    return f"{method} (a trial)" if trial else str(method)


def prompt_reading_line(summary: list[dict[str, Any]]) -> str | None:
    """Our plain decoding's time to the first tokens against llama.cpp plain's, summed over
    the prompts (each read from an empty cache, so mostly the prompt reading), or ``None``
    without both rows' first-token times."""
    overall = {r["row"]: r.get("first_token_s") for r in summary if r["kind"] == "overall"}
    ours, peer = overall.get("plain (ours)"), overall.get(f"{LLAMA_CPP} plain")
    if not ours or not peer:
        return None
    return (f"Prompt reading (time to the first token, summed over the prompts, each from an "
            f"empty cache): plain (ours) {ours:.2f} s, {LLAMA_CPP} plain {peer:.2f} s: our "
            f"rate {peer / ours:.2f}× {LLAMA_CPP}'s.")


def markdown(summary: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        f"Benchmark {meta['date']} · {header(meta)} · target {meta['target']}"
        + (f" + draft {meta['draft']}" if meta["draft"] else "")
        + f" · {meta['prompts']} prompts · ≤{meta['max_tokens']} new tokens · greedy"
        + f" · linear layers {meta['accel']}"
        + f" · native kernels {meta.get('kernels') or 'off'}",
        "",
        f"Target forward: {meta.get('plan_summary', 'not recorded')}",
        "",
        *(f"{label}: {head_line(meta[key])}" for key, label in
          (("head", "EAGLE head (rows `eagle …`)"), ("compared_head", "Compared head (rows "
                                                                       "`eagle … [file]`)"))
          if meta.get(key)),
        *([""] if meta.get("head") else []),
        "| row | tok/s | speedup | generation tok/s² | speedup² | acceptance | tokens/pass "
        "| identical¹ | peak RSS |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | :---: | ---: |",
    ]
    for r in (r for r in summary if r["kind"] == "overall"):
        lines.append(
            f"| {r['row']} | {r['tokens_per_s']:.2f} | {r['speedup']:.2f}× | "
            f"{fmt(r['generation_tokens_per_s'], '.2f')} | "
            f"{fmt(r['generation_speedup'], '.2f')}{'×' if r['generation_speedup'] else ''} | "
            f"{fmt(r['acceptance_rate'], '.0%')} | {fmt(r['tokens_per_pass'], '.2f')} | "
            f"{fmt(r['identical'], '')} | {r['peak_rss_gb']:.1f} GB |"
        )
    kinds = [k for k in KINDS if any(r["kind"] == k for r in summary)]
    lines += ["", "¹ answers with the same token ids as plain decoding on the same engine "
              f"(our plain for our rows and transformers', {LLAMA_CPP} plain for {LLAMA_CPP}'s).",
              "² after each answer's first token: the target's prompt processing (the same for "
              "every row of an engine) left out; a draft model or EAGLE head reads the prompt "
              "after the first token, so its reading stays in."]
    for title, key, unit in (
            ("Speedup over plain by prompt kind", "speedup", "×"),
            ("Generation speedup² by prompt kind", "generation_speedup", "×"),
            ("Tokens per pass by prompt kind (the mean accepted length: drafts accepted plus "
             "the target's own token)", "tokens_per_pass", "")):
        lines += ["", f"{title}:", "",
                  "| row | " + " | ".join(kinds) + " |", "| --- |" + " ---: |" * len(kinds)]
        for name in dict.fromkeys(r["row"] for r in summary):
            cells = [next(r for r in summary if r["row"] == name and r["kind"] == k)[key]
                     for k in kinds]
            lines.append(f"| {name} | " + " | ".join(
                f"{fmt(c, '.2f')}{unit if c else ''}" for c in cells) + " |")
    chosen = [(r["kind"], r["methods"], r.get("trials") or [False] * len(r["methods"]))
              for r in summary
              if r["row"].startswith("auto") and r["kind"] != "overall" and r.get("methods")]
    if chosen:
        lines += ["", "What auto ran, per prompt: " + "; ".join(
            f"{kind}: " + ", ".join(ran_as(m, t) for m, t in zip(methods, trials, strict=True))
            for kind, methods, trials in chosen) + "."]
        if any(any(trials) for _, _, trials in chosen):
            lines.append(TRIAL_NOTE)
    reading = prompt_reading_line(summary)
    if reading:
        lines += ["", reading]
    costs = meta["verify_cost_s"]
    lines += ["", "Verification cost t(k)/t(1) of one target forward (warm cache): "
              + ", ".join(f"k={k}: {costs[k] / costs[1]:.2f}" for k in costs)
              + f" (t(1) = {costs[1] * 1000:.0f} ms).", ceiling_line(meta)]
    if meta.get("variant_ab"):
        lines += ["", variants_markdown(meta["variant_ab"]["kernel_gmac_s"],
                                        meta["variant_ab"]["models"]).rstrip()]
    return "\n".join(lines) + "\n"


RowSpec = tuple[str, Callable[[ChatEngine, list[int], str], Run]]


def stock_spec(target: str, data_dir: str | None, max_tokens: int) -> RowSpec:
    """Plain decoding of a second copy of the target on transformers' own layers."""
    loaded: list[ChatEngine] = []  # loaded on the row's first (warm-up) call

    def run(e: ChatEngine, ids: list[int], kind: str) -> Run:
        if not loaded:
            loaded.append(ChatEngine.load(target, None, data_dir=data_dir, accel="off"))
        return run_ours(loaded[0], ids, kind, "off", 0, max_tokens)

    return STOCK, run


def row_specs(engine: ChatEngine, k: int, max_tokens: int,
              variants: Sequence[str] = ()) -> list[RowSpec]:
    """The rows to run, first the plain baseline; only methods the models allow; plain
    decoding under each of ``variants`` (kernel variants) after it."""

    def ours(method: str, length: DraftLength, branches: int = 0
             ) -> Callable[[ChatEngine, list[int], str], Run]:
        def run(e: ChatEngine, ids: list[int], kind: str) -> Run:
            with branching(e.drafters.get(method), branches):
                return run_ours(e, ids, kind, method, length, max_tokens)

        return run

    def peer(mode: str) -> Callable[[ChatEngine, list[int], str], Run]:
        return lambda e, ids, kind: run_transformers(e, ids, kind, mode, max_tokens, k)

    def plain_under(name: str) -> Callable[[ChatEngine, list[int], str], Run]:
        def run(e: ChatEngine, ids: list[int], kind: str) -> Run:
            with kernel_variant(name):
                return run_ours(e, ids, kind, "off", k, max_tokens)

        return run

    specs: list[RowSpec] = [("plain (ours)", ours("off", k))]
    specs += [(f"plain [{name}]", plain_under(name)) for name in variants]
    specs.append(("auto (the default)", ours(AUTO, ADAPTIVE)))
    for method in ("draft", "ngram", "suffix", "hybrid", "eagle", "hybrid-eagle"):
        if method in engine.methods:
            specs += [(f"{method} k={k}", ours(method, k)),
                      (f"{method} adaptive", ours(method, ADAPTIVE))]
        if method in ("draft", "eagle") and method in engine.methods:
            specs.append((f"{method} tree k={k}", ours(method, k, TREE_BRANCHES)))
    if engine.draft is not None:
        specs.append(("transformers assisted (draft model)", peer("assisted")))
    specs.append(("transformers prompt lookup", peer("lookup")))
    return specs + llama_cpp_specs(engine, k, max_tokens)


TREE_BRANCHES = 2  # alternatives a tree row's drafter adds beside its chain


def head_specs(other: Any, k: int, max_tokens: int) -> list[RowSpec]:
    """``eagle`` and ``hybrid-eagle`` rows drafting with another head (``--head FILE``),
    side by side with the engine's own: for each run it stands in for the engine's
    ``eagle`` drafter (which the hybrid finds by name), from a fresh cache, under the
    row's own adaptive state. What its answers show is not kept (:func:`unlearned`): their
    acceptance and draft step would count as the engine's own head's, both for ``auto``'s
    choices in the run and in the ``--observations-out`` file."""

    def swapped(length: DraftLength, branches: int = 0, method: str = "eagle"
                ) -> Callable[[ChatEngine, list[int], str], Run]:
        def run(e: ChatEngine, ids: list[int], kind: str) -> Run:
            before = e.drafters["eagle"]
            e.drafters["eagle"] = other
            other.reset()
            try:
                with unlearned(e), branching(other, branches):
                    return run_ours(e, ids, kind, method, length, max_tokens)
            finally:
                e.drafters["eagle"] = before

        return run

    name = other.info.get("file", "other head")
    return [(f"eagle k={k} [{name}]", swapped(k)),
            (f"eagle adaptive [{name}]", swapped(ADAPTIVE)),
            (f"eagle tree k={k} [{name}]", swapped(k, TREE_BRANCHES)),
            (f"hybrid-eagle adaptive [{name}]", swapped(ADAPTIVE, method="hybrid-eagle"))]


@contextmanager
def unlearned(engine: ChatEngine) -> Iterator[None]:
    """Answers whose figures the engine forgets afterwards: its observations (what ``auto``
    chooses from and ``--observations-out`` writes) and its calibration are as before."""
    observations, calibration = engine.observations, engine.calibration
    engine.observations = copy.deepcopy(observations)
    try:
        yield
    finally:
        engine.observations, engine.calibration = observations, calibration


@contextmanager
def branching(drafter: Any, branches: int) -> Iterator[None]:
    """Let ``drafter`` draft trees with ``branches`` alternatives for one run."""
    if not branches:
        yield
        return
    before = drafter.branches
    drafter.branches = branches
    try:
        yield
    finally:
        drafter.branches = before


def rotation(rows: int, prompt: int) -> list[int]:
    """The order rows run in on prompt ``prompt``: shifted by one each prompt."""
    return [(prompt + i) % rows for i in range(rows)]


def run_rows(engine: ChatEngine, specs: list[RowSpec], prompts: list[dict[str, str]]) -> list[Row]:
    """Every row on every prompt, interleaved: prompt by prompt, rows in rotating order.

    A slow spell of the machine then falls on all rows alike instead of on whole rows.
    Each row keeps its own adaptive policies and suffix corpus across its prompts. Each
    row's warm-up call leaves the engine's observations and calibration as they were.
    """
    encoded = [(p["kind"], engine.encode([{"role": "user", "content": p["prompt"]}]))
               for p in prompts]
    rows, states = [Row(name) for name, _ in specs], [RowState() for _ in specs]
    # warm-ups (and lazy loads), not measured and not learnt from: a first call's timings
    # and a 32-token prompt's answers are not what auto should start the run from
    with unlearned(engine):
        for _, fn in specs:
            enter(engine, RowState())
            fn(engine, encoded[0][1][:32], encoded[0][0])
    for i, (kind, ids) in enumerate(encoded):
        for r in rotation(len(specs), i):
            enter(engine, states[r])
            with peak_rss(rows[r]):
                rows[r].runs.append(specs[r][1](engine, ids, kind))
        log.info("prompt %d/%d (%s) done", i + 1, len(encoded), kind)
    for row in rows:
        log.info("%-36s %6.2f tok/s", row.name,
                 sum(len(r.tokens) for r in row.runs) / sum(r.seconds for r in row.runs))
    return rows


def cpu_name(cpuinfo: str | None = None) -> str:
    """The processor as ``/proc/cpuinfo`` (or ``cpuinfo``, its text) names it, with its
    family and model: under some hypervisors the name alone ("AMD EPYC") covers several
    generations (a Zen 1 and a Zen 3 EPYC, family 23 and 25). ``platform.processor()``
    where the file cannot be read or names nothing."""
    fields = cpu_fields(cpuinfo)
    name = fields.get("model name") or platform.processor() or platform.machine()
    family, model = fields.get("cpu family"), fields.get("model")
    return f"{name} (family {family} model {model})" if family and model else name


def machine() -> str:
    """The machine as a run's header names it: CPU (:func:`cpu_name`), threads, memory, torch."""
    gib = psutil.virtual_memory().total / 2**30
    threads = torch.get_num_threads()
    return f"{cpu_name()}, {threads} threads, {gib:.0f} GiB, torch {torch.__version__}"


def simd_flags() -> list[str]:
    """This CPU's flags among those the kernel variants use or a note names (lscpu's)."""
    named = {"avx512_bf16", "avx512_fp16", "amx_bf16"}
    return sorted(kernels.cpu_flags() & set().union(named, *(v.cpu for v in kernels.VARIANTS)))


def run_meta(profile: str, argv: list[str] | None) -> dict[str, Any]:
    """What every run's JSON and Markdown header say of it: when, where and how."""
    args = sys.argv[1:] if argv is None else argv
    return {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": machine(),
            "cpu_flags": simd_flags(), "profile": profile,
            "command": " ".join(["python -m engine.bench", *args])}


def header(meta: dict[str, Any]) -> str:
    """``meta``'s machine, SIMD flags and command, for a Markdown header."""
    return (f"{meta['machine']} ({' '.join(meta.get('cpu_flags') or ()) or 'no SIMD flags read'})"
            + (f" · `{meta['command']}`" if meta.get("command") else ""))


@dataclass
class Recorded(Observations):
    """The engine's observations that also record every answer in ``run``: what a file of
    this run's answers holds, while ``auto`` chooses from all (shipped priors included)."""

    run: Observations = field(default_factory=Observations)

    def record(self, method: str, kind: str, answer: Seen, prompt_tokens: int,
               answer_tokens: int) -> None:
        super().record(method, kind, answer, prompt_tokens, answer_tokens)
        self.run.record(method, kind, answer, prompt_tokens, answer_tokens)

    def forget(self, method: str) -> None:
        super().forget(method)
        self.run.forget(method)


def write_observations(path: Path, observations: Observations, models: list[str | None],
                       specs: list[RowSpec], prompts: int) -> None:
    """What the run's answers showed per method and kind (:mod:`engine.spec.calibration`'s
    observations), in the file format :func:`engine.spec.calibration.shipped_observations` reads."""
    data = {"format": PRIOR_FORMAT, "models": models,
            "observations": observations.to_json(),
            "source": {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": machine(),
                       "rows": [name for name, _ in specs], "prompts": prompts,
                       "command": "python -m engine.bench " + " ".join(sys.argv[1:])}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    log.info("wrote the observations to %s", path)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m engine.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="light profile, 1 prompt per kind")
    parser.add_argument("--profile", choices=sorted(PROFILES), default=None)
    parser.add_argument("--per-kind", type=int, default=None, help="prompts per kind (max 4)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--k", type=int, default=None,
                        help="fixed draft length of the fixed rows (default: 4, or what one "
                        "cheap verification holds if less)")
    parser.add_argument("--rows", default="", help="comma-separated substrings: run only these")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--accel", default="auto", choices=ACCELERATIONS,
                        help="linear-layer kernels of every row (default auto)")
    parser.add_argument("--stock", action="store_true",
                        help="add plain decoding on transformers' own layers (a second copy)")
    parser.add_argument("--variants", action="store_true",
                        help="plain rows and an A/B under every native kernel variant")
    parser.add_argument("--kernels-only", action="store_true",
                        help="only the kernel variants' A/B (q4k GMAC/s, t(k), prompt reading)")
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument("--observations-out", type=Path, default=None,
                        help="also write what the rows' answers showed per method and kind "
                             "(from an empty start), as assets/calibration/ ships it")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--head", type=Path, default=None,
                        help="also run eagle rows with this head file, side by side with the "
                             "engine's own head")
    parser.add_argument("--concurrency", default=None,
                        help="answers at once, e.g. 1,2,4: run the load benchmark instead")
    parser.add_argument("--rounds", type=int, default=2,
                        help="with --concurrency: rounds a level and mode (at least 2)")
    return parser.parse_args(argv)


def load_bench(engine: ChatEngine, args: argparse.Namespace, profile: str,
               argv: list[str] | None = None) -> int:
    """``--concurrency``: the load benchmark, one prompt per kind (see the module)."""
    levels = parse_levels(args.concurrency)
    prompts = [p["prompt"] for p in load_prompts(PROMPTS, 1)]
    data = run_load(engine, prompts, levels, args.max_tokens, args.rounds)
    meta = {**run_meta(profile, argv), "target": engine.target.name,
            "draft": None if engine.draft is None else engine.draft.name,
            "kernels": kernels.variant(),
            "plan_summary": engine.runner.model_forward.plan.summary(),
            "max_tokens": args.max_tokens}
    table = (f"Load benchmark {meta['date']} · {header(meta)} · {profile} · kernels "
             f"{meta['kernels']} · {args.max_tokens} new tokens\n\n" + load_markdown(data))
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"load-{profile}-{time.strftime('%Y%m%d-%H%M')}"
    stem.with_suffix(".md").write_text(table)
    stem.with_suffix(".json").write_text(json.dumps({"meta": meta, **data}, indent=1))
    sys.stdout.write(table)
    log.info("wrote %s.json and .md", stem)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.concurrency is not None:
        try:
            parse_levels(args.concurrency)
            check_rounds(args.rounds)
        except ValueError as exc:
            sys.stderr.write(f"error: {exc}\n")
            return 2
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    profile = args.profile or ("light" if args.quick else "appliance")
    per_kind = args.per_kind or (1 if args.quick else 4)
    target, draft = PROFILES[profile]
    engine = ChatEngine.load(target, draft, dtype=args.dtype, data_dir=args.data_dir,
                             accel=args.accel)
    running = kernels.variant()
    others = [v for v in kernels.buildable() if v != running] if running else []
    ab: dict[str, Any] | None = None
    if (args.variants or args.kernels_only) and running:
        everyone = [*others, running]
        models = {target: (engine.target.model, engine.target.gguf)}
        if engine.draft is not None:
            models[draft or "draft"] = (engine.draft.model, engine.draft.gguf)
        ab = {"kernel_gmac_s": kernel_throughput(everyone),
              "models": {name: variant_costs(ModelRunner(model), everyone,
                                             peer=llama_cpp_peer(gguf))
                         for name, (model, gguf) in models.items()}}
    if args.kernels_only:
        if ab is None:
            log.error("native kernels not running here: nothing to compare")
            return 1
        args.out.mkdir(parents=True, exist_ok=True)
        stem = args.out / f"kernels-{profile}-{time.strftime('%Y%m%d-%H%M')}"
        meta = run_meta(profile, argv)
        table = (f"Kernel variants {meta['date']} · {header(meta)} · "
                 f"running {running} · CPU flags for: {', '.join(kernels.supported())}\n\n"
                 + variants_markdown(ab["kernel_gmac_s"], ab["models"]))
        stem.with_suffix(".md").write_text(table)
        stem.with_suffix(".json").write_text(json.dumps({"meta": meta, "running": running, **ab},
                                                        indent=1))
        sys.stdout.write(table)
        return 0
    if args.concurrency is not None:
        return load_bench(engine, args, profile, argv)
    k = args.k or min(4, engine.max_adaptive)
    specs = row_specs(engine, k, args.max_tokens, others if args.variants else ())
    compared = None
    if args.head is not None:
        if "eagle" not in engine.methods:
            sys.stderr.write("error: --head compares with the engine's own head, and this "
                             "target has none\n")
            return 2
        compared = eagle_for(engine.target, args.head)
        assert compared is not None  # a file that does not load raises
        specs += head_specs(compared, k, args.max_tokens)
    if args.stock:
        specs.insert(1, stock_spec(target, args.data_dir, args.max_tokens))
    wanted = [w for w in args.rows.split(",") if w]
    specs = [s for i, s in enumerate(specs)
             if i == 0 or not wanted or any(w in s[0] for w in wanted)]
    prompts = load_prompts(PROMPTS, per_kind)
    if any(name.startswith("auto") for name, _ in specs):
        for _ in engine.calibrate(None):  # what a worker measures at start, for auto
            pass
    costs = verification_costs(engine)
    bandwidth, reading = copy_bandwidth(), read_bandwidth()
    recorded = Recorded(engine.observations.seen, engine.observations.lengths)
    engine.observations = recorded  # auto starts from the shipped ones, as a worker
    rows = run_rows(engine, specs, prompts)
    if args.observations_out is not None:
        write_observations(args.observations_out, recorded.run, [target, draft], specs,
                           len(prompts))
    summary = summarise(rows, KINDS)
    weights = weight_bytes_per_token(engine.target.model)
    plain = next(r for r in summary if r["kind"] == "overall")  # the first row: plain
    plain_tps, plain_gen = plain["tokens_per_s"], plain["generation_tokens_per_s"]
    meta = {
        **run_meta(profile, argv), "target": target, "draft": draft, "dtype": args.dtype,
        "prompts": len(prompts),
        "accel": engine.target.accel, "fixed_k": k, "kernels": running,
        "plan": engine.runner.model_forward.plan.to_dict(),
        "plan_summary": engine.runner.model_forward.plan.summary(),
        "head": engine.speculation_report()["head"],
        "compared_head": None if compared is None else compared.info,
        "variant_ab": ab,
        "max_tokens": args.max_tokens, "verify_cost_s": costs, "copy_gb_s": bandwidth / 1e9,
        "weight_gb": weights / 1e9, "ceiling_tps": bandwidth / weights,
        "plain_pct_of_ceiling": 100 * plain_tps / (bandwidth / weights),
        "read_gb_s": reading / 1e9, "read_ceiling_tps": reading / weights,
        "plain_generation_tps": plain_gen,
        "plain_generation_pct_of_read": (None if plain_gen is None
                                         else 100 * plain_gen / (reading / weights)),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"bench-{profile}-{time.strftime('%Y%m%d-%H%M')}"
    table = markdown(summary, meta)
    stem.with_suffix(".md").write_text(table)
    stem.with_suffix(".json").write_text(json.dumps(
        {"meta": meta, "summary": summary, "rows": [asdict(r) for r in rows]}, indent=1))
    sys.stdout.write(table)
    log.info("wrote %s.json and .md", stem)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
