"""Replay drafting on recorded greedy answers: what a drafting method would gain, fast.

``python -m engine.tools.replay RESULTS.json`` (a benchmark's JSON file) predicts the speedup
of drafting methods and settings over plain decoding, per prompt kind, in minutes
instead of a benchmark run per setting. Use it to tune; claim speed with the benchmark.

Why this is exact for acceptance: under greedy verification a pass keeps the longest
prefix of the draft that equals what the target says anyway, and the target's greedy
answer is recorded in the benchmark's plain row. A lookup drafter only reads the
context, so it replays exactly. A draft model's greedy chain from answer position
``i`` agrees with the answer for as long as the model's prediction *given the true
context* agrees at each position (up to the first miss both contexts are the same),
so one forward of the draft model over prompt + answer (:func:`trace`) gives every
chain's accepted length and the confidences that stop it. An EAGLE head's later steps
read its own predicted features, not the target's, so its chains come from one forward
per draft step over every position at once (:func:`head_trace`, the head's steps as
:func:`engine.heads.model.draft_steps` unrolls them, through the drafter's own
quantized layers and trimmed output layer). What a chain proposes after its first miss
is unknown; the replay lets it run on to its limit (the cost a pass may pay, never a
token gained).

Costs are measured here on the same models: ``t(k)`` of the target, the draft model's
forward over ``k`` tokens (a step, or a catch-up with context it did not see), and
its prompt processing per prompt; the head's step and its reading per prompt token
come from :func:`engine.spec.calibration.measure`. Times are in units of ``t(1)`` and
scaled, per prompt, by the recorded plain generation time per token; the recorded time
to the first token is kept, and the model's prompt processing is added before its first
draft, as the engine reads it (an answer it never drafts for does not pay for it).
The adaptive methods' policies start from these costs, each drafter's step and reading as
:func:`engine.spec.calibration.measure` gives them, as the worker's calibrated policies do
(:meth:`engine.spec.policy.DraftPolicy.calibrated`); each method keeps one policy over
all the prompts, where the worker keeps one per kind of prompt.
"""

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.heads.model import draft_steps
from engine.models.registry import PROFILES
from engine.spec import calibration
from engine.spec.drafters.draft_model import DRAFT_WINDOW
from engine.spec.drafters.eagle import EagleDrafter
from engine.spec.drafters.hybrid import lookup_drafts
from engine.spec.drafters.ngram import ngram_lookup
from engine.spec.drafters.suffix import SuffixDrafter
from engine.spec.policy import DraftPolicy, PartPolicies, Policy
from engine.spec.runner import ModelRunner
from engine.spec.sampling import SamplingParams
from engine.spec.session import ChatEngine
from engine.tools.bench import KINDS, PROMPTS, forward_costs, load_prompts

log = logging.getLogger(__name__)

Costs = Callable[[int], float]  # tokens fed -> seconds, or units of t(1)
GREEDY, GENERATOR = SamplingParams(), torch.Generator()  # what lookups are called with
LOOKUP, MODEL = "lookup", "model"  # a hybrid's parts
# The steps of a head's chains traced (head_trace), so the longest draft its replay asks;
# at a head's acceptance (about 0.4 a token) a fifth step is accepted about 1 % of the time
HEAD_DEPTH = 4


@dataclass
class Case:
    """One benchmark prompt: its ids, plain decoding's answer and timings."""

    kind: str
    prompt: list[int]
    answer: list[int]
    seconds: float
    first_s: float

    @property
    def per_token_s(self) -> float:
        """Plain decoding's time per token after the first (one target step)."""
        return (self.seconds - self.first_s) / max(1, len(self.answer) - 1)


@dataclass
class Trace:
    """The draft model's greedy prediction and its probability at each answer position."""

    predicted: list[int]
    confidence: list[float]
    prefill_s: float

    def guess(self, i: int, j: int) -> tuple[int, float]:
        """Step ``j + 1`` of the chain begun at answer position ``i`` while it has been
        right: the guess for position ``i + j`` and its probability. A model reading
        the true context guesses there what it guesses from the chain's own tokens."""
        return self.predicted[i + j], self.confidence[i + j]


@dataclass
class HeadTrace(Trace):
    """An EAGLE head's chains: ``steps[j][i]`` and ``step_confidence[j][i]`` are step
    ``j + 1`` of the chain begun at answer position ``i`` (``-1`` past the answer)."""

    steps: list[list[int]] = field(default_factory=list)
    step_confidence: list[list[float]] = field(default_factory=list)

    def guess(self, i: int, j: int) -> tuple[int, float]:
        return self.steps[j][i], self.step_confidence[j][i]


def interpolate(points: dict[int, float]) -> Costs:
    """Piecewise-linear ``k -> cost`` through measured points, extended linearly."""
    ks = sorted(points)

    def cost(k: int) -> float:
        if k in points:
            return points[k]
        lo = max([x for x in ks if x < k], default=ks[0])
        hi = min([x for x in ks if x > k], default=ks[-1])
        if lo == hi:  # beyond the measured range: the last slope
            lo, hi = (ks[-2], ks[-1]) if k > ks[-1] else (ks[0], ks[1])
        return points[lo] + (points[hi] - points[lo]) * (k - lo) / (hi - lo)

    return cost


def model_chain(trace: Trace, answer: Sequence[int], i: int, k: int,
                min_confidence: float) -> tuple[int, int]:
    """``(drafted, accepted)`` of a model's greedy chain of at most ``k`` at ``i``."""
    accepted = 0
    for j in range(min(k, len(answer) - i)):
        token, confidence = trace.guess(i, j)
        hit = token == answer[i + j]
        if confidence < min_confidence:
            return j + 1, accepted + hit  # this guess is proposed, then drafting stops
        if not hit:
            return k, accepted  # what follows a miss is unknown: assume it runs on
        accepted += 1
    return min(k, len(answer) - i), accepted


def kept(draft: Sequence[int], answer: Sequence[int], i: int) -> int:
    """Tokens of ``draft`` that greedy verification at answer position ``i`` keeps."""
    n = 0
    while n < len(draft) and i + n < len(answer) and draft[n] == answer[i + n]:
        n += 1
    return n


@dataclass
class Method:
    """A drafting setting to replay: ``lookup`` (ngram/suffix/None) and/or a model
    (``"draft"``, the draft model, or ``"eagle"``, the head), the lookup first."""

    name: str
    k: int | None  # fixed draft length, None = the adaptive policy
    lookup: str | None = None
    model: str | None = None
    min_confidence: float = 0.8
    policy: Policy = field(default_factory=DraftPolicy)
    suffix: SuffixDrafter = field(default_factory=SuffixDrafter)

    def __post_init__(self) -> None:
        if self.lookup and self.model and isinstance(self.policy, DraftPolicy):
            self.policy = PartPolicies({LOOKUP: self.policy, MODEL: DraftPolicy()})


def lookup(method: Method, context: list[int], k: int) -> list[int]:
    """The draft of ``method``'s lookup after ``context``, at most ``k`` tokens."""
    if method.lookup == "ngram":
        return ngram_lookup(np.asarray(context), k)
    return list(method.suffix.propose(context, k, GREEDY, GENERATOR).tokens)


def replay(case: Case, trace: Trace | None, method: Method, t: Costs, d: Costs
           ) -> tuple[float, list[int]]:
    """Predicted generation time of ``case`` after its first token (in the unit of ``t``
    and ``d``; with a model's prompt reading before its first draft, if it drafts) and the
    tokens each pass's verification kept.

    A hybrid (a lookup and a model) routes each pass as the engine's does
    (:meth:`engine.spec.drafters.hybrid.HybridDrafter.part_for`): to the lookup where it
    finds enough tokens (:func:`engine.spec.drafters.hybrid.lookup_drafts`) at the longest
    draft the pass allows, and adaptive, with that part's policy
    (:class:`engine.spec.policy.PartPolicies`)."""
    answer, context = case.answer, list(case.prompt)
    i, total, cached = 0, 0.0, len(case.prompt) - 1  # the model's cache length
    read = False  # the model has read the prompt (the engine does so before its first draft)
    kept_per_pass: list[int] = []
    method.policy.new_answer()
    while i < len(answer):
        room = len(answer) - i
        part, found = None, []
        if method.lookup and method.model:
            longest = min(method.k or method.policy.max_gamma, room - 1)
            found = lookup(method, context, longest)
            part = LOOKUP if lookup_drafts(len(found), longest) else MODEL
        policy = method.policy.select(part)
        gamma = min(method.k, room - 1) if method.k else policy.next_gamma(room)
        drafted = accepted = catch_up = 0
        draft_cost = 0.0
        if gamma > 0 and method.lookup and part != MODEL:
            # a routed lookup's shorter draft is a prefix of the one it found
            tokens = found[:gamma] if part == LOOKUP else lookup(method, context, gamma)
            drafted, accepted = len(tokens), kept(tokens, answer, i)
        if gamma > 0 and method.model and drafted == 0 and trace is not None:
            if not read:
                total += trace.prefill_s / case.per_token_s
                read = True
            drafted, accepted = model_chain(trace, answer, i, gamma, method.min_confidence)
            catch_up = len(context) - cached
            draft_cost = d(catch_up) + (drafted - 1) * d(1)
            # the draft model keeps its drafts' entries; a head drops them after drafting
            cached = len(context) + drafted - 1 if method.model == "draft" else len(context)
        verify = t(drafted + 1)
        total += verify + draft_cost
        if not method.k:
            policy.update(drafted, accepted, draft_cost, verify, catch_up)
        cached = min(cached, len(context) + accepted)
        kept_per_pass.append(accepted)
        context += answer[i : i + accepted + 1]
        i += accepted + 1
    method.suffix.add_document(answer)
    return total - t(1), kept_per_pass  # the first token's step: in the first-token time


def predict(cases: Sequence[Case], traces: Sequence[Trace], method: Method, t: Costs,
            d: Costs) -> dict[str, tuple[float, float]]:
    """Per kind and ``overall``: (speedup, speedup after the first token) over plain."""
    sums: dict[str, list[float]] = {}
    for case, trace in zip(cases, traces, strict=True):
        units, _ = replay(case, trace, method, t, d)
        gen = units * case.per_token_s  # with the model's prompt reading, if it drafted
        for key in (case.kind, "overall"):
            s = sums.setdefault(key, [0.0, 0.0, 0.0, 0.0])
            s[0] += case.seconds
            s[1] += case.first_s + gen
            s[2] += case.seconds - case.first_s
            s[3] += gen
    return {key: (s[0] / s[1], s[2] / s[3]) for key, s in sums.items()}


@torch.inference_mode()
def trace(runner: ModelRunner, case: Case, window: int | None = DRAFT_WINDOW) -> Trace:
    """The draft model's predictions over ``case``'s answer, given the true context as
    the drafter reads it (the prompt's last ``window`` tokens on)."""
    runner.reset()
    start = time.perf_counter()
    seen = case.prompt if window is None else case.prompt[-window:]
    runner.sync(seen[:-1])
    prefill_s = time.perf_counter() - start
    fed = [case.prompt[-1], *case.answer[:-1]]
    predicted: list[int] = []
    confidence: list[float] = []
    for at in range(0, len(fed), runner.tree_rows):  # bounded logits [rows, V] at a time
        chunk = fed[at : at + runner.tree_rows]
        top = runner.forward(chunk, rows=len(chunk)).float().softmax(-1).max(-1)  # [n]
        predicted += top.indices.tolist()
        confidence += top.values.tolist()
    return Trace(predicted, confidence, prefill_s)


@torch.inference_mode()
def head_trace(drafter: EagleDrafter, target: Any, case: Case, k: int, read: float = 0.0
               ) -> HeadTrace:
    """The head's greedy chains of up to ``k`` over ``case``'s answer, each begun from the
    true context with the target's features, as :class:`EagleDrafter` drafts them.

    ``read``: the head's reading of a prompt token in ``t(1)``, which with the case's
    plain step gives its prompt reading in seconds."""
    if len(case.prompt) < 2:
        raise ValueError("a head needs a prompt of at least two tokens to draft from")
    runner = ModelRunner(target)
    runner.keep_hidden(True, drafter.feature_layers)
    ids = [*case.prompt, *case.answer]
    runner.sync(ids[:-1])
    assert runner.hidden is not None
    dtype = runner.hidden.dtype  # what the drafter's output layer reads
    features = runner.hidden[None].to(drafter.dtype)  # [1, n, F], n = len(ids) - 1
    embeds = drafter.embed(torch.tensor([ids[1:]], dtype=torch.long)).to(drafter.dtype)
    first = len(case.prompt) - 2  # the row the chain at answer position 0 is fed
    steps: list[list[int]] = []
    confidence: list[list[float]] = []
    for pred in draft_steps(drafter.head, features, embeds, k):  # [1, n - s + 1, H]
        top = drafter.lm_head(pred[0, first:].to(dtype)).float().softmax(-1).max(-1)
        n = len(case.answer)  # chains begun at 0..n-1; a step past the answer has no row
        steps.append((top.indices.tolist() + [-1] * n)[:n])
        confidence.append((top.values.tolist() + [0.0] * n)[:n])
    steps += [[-1] * len(case.answer)] * (k - len(steps))
    confidence += [[0.0] * len(case.answer)] * (k - len(confidence))
    prefill_s = read * (len(case.prompt) - 1) * case.per_token_s
    return HeadTrace([], [], prefill_s, steps, confidence)


def measure_costs(target: ModelRunner, draft: ModelRunner | None, reps: int = 15
                  ) -> tuple[dict[int, float], dict[int, float]]:
    """Median seconds of target verifications over k = 1..8 new tokens and of the draft
    model's forward over k (a step, or a catch-up), taking turns (:func:`forward_costs`)."""
    runners: list[tuple[ModelRunner, tuple[int, ...], bool]] = [(target, (1, 2, 3, 4, 5, 8), True)]
    if draft is not None:
        runners.append((draft, (1, 2, 4, 8), False))
    costs = forward_costs(runners, reps)
    return costs[0], costs[1] if draft is not None else {}


def load_cases(engine: ChatEngine, results: dict[str, Any]) -> list[Case]:
    """The benchmark's prompts (re-encoded) with its plain row's answers and times."""
    plain = next(r for r in results["rows"] if r["name"] == "plain (ours)")
    prompts = load_prompts(PROMPTS, results["meta"]["prompts"] // len(KINDS))
    cases = []
    for prompt, run in zip(prompts, plain["runs"], strict=True):
        ids = engine.encode([{"role": "user", "content": prompt["prompt"]}])
        cases.append(Case(run["kind"], ids, run["tokens"], run["seconds"], run["first_s"]))
    return cases


def fresh(drafter: str, max_gamma: int) -> DraftPolicy:
    """A policy that measures every cost itself (no calibration)."""
    del drafter
    return DraftPolicy(max_gamma=max_gamma)


def methods(min_confidences: Sequence[float], head_confidences: Sequence[float] = (),
            policy: Callable[[str, int], DraftPolicy] = fresh) -> list[Method]:
    """The settings replayed: the lookups, the draft model and its hybrid at each of
    ``min_confidences``, and the head alone and after the suffix lookup at each of
    ``head_confidences``. ``policy(drafter, max_gamma)`` makes each adaptive method's
    policy (one per part for a hybrid), as the worker does from its calibration."""

    def parts(lookup_name: str, model: str, depth: int) -> PartPolicies:
        return PartPolicies({LOOKUP: policy(lookup_name, 8), MODEL: policy(model, depth)})

    out = [Method(f"ngram k={k}", k, lookup="ngram") for k in (3, 4)]
    out.append(Method("ngram adaptive", None, lookup="ngram", policy=policy("ngram", 8)))
    out.append(Method("suffix adaptive", None, lookup="suffix", policy=policy("suffix", 8)))
    for c in min_confidences:
        out += [Method(f"draft k=4 min_conf={c}", 4, model="draft", min_confidence=c),
                Method(f"draft adaptive min_conf={c}", None, model="draft", min_confidence=c,
                       policy=policy("draft", 8)),
                Method(f"hybrid adaptive min_conf={c}", None, lookup="suffix", model="draft",
                       min_confidence=c, policy=parts("suffix", "draft", 8))]
    for c in head_confidences:  # a head's chains are traced HEAD_DEPTH deep
        out += [Method(f"eagle k=4 min_conf={c}", 4, model="eagle", min_confidence=c),
                Method(f"eagle adaptive min_conf={c}", None, model="eagle", min_confidence=c,
                       policy=policy("eagle", HEAD_DEPTH)),
                Method(f"hybrid-eagle adaptive min_conf={c}", None, lookup="suffix",
                       model="eagle", min_confidence=c,
                       policy=parts("suffix", "eagle", HEAD_DEPTH))]
    return out


def table(rows: list[tuple[str, dict[str, tuple[float, float]]]]) -> str:
    head = "| method | overall | " + " | ".join(KINDS) + " |"
    lines = [head, "| --- |" + " ---: |" * (len(KINDS) + 1)]
    for name, pred in rows:
        cells = [f"{pred[k][0]:.2f}x ({pred[k][1]:.2f}x)" for k in ("overall", *KINDS)]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.tools.replay", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path, help="a benchmark's JSON file (with its plain row)")
    parser.add_argument("--min-confidence", default="0.3,0.5,0.8",
                        help="comma-separated draft-model thresholds to replay")
    parser.add_argument("--head-confidence", default="0.1,0.3,0.5",
                        help="comma-separated EAGLE head thresholds to replay")
    parser.add_argument("--head", type=Path, default=None,
                        help="EAGLE head file to replay (default: the installed or shipped one)")
    args = parser.parse_args(argv)
    if args.head is not None and not args.head.is_file():
        parser.error(f"{args.head} does not exist")
    try:
        wanted = [float(c) for c in args.min_confidence.split(",") if c]
        head_wanted = [float(c) for c in args.head_confidence.split(",") if c]
    except ValueError as e:
        parser.error(f"thresholds are comma-separated numbers ({e})")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    results = json.loads(args.results.read_text())
    target, draft = PROFILES[results["meta"]["profile"]]
    engine = ChatEngine.load(target, draft, head=args.head)
    cases = load_cases(engine, results)
    runner: ModelRunner | None = getattr(engine.drafters.get("draft"), "runner", None)
    head = engine.drafters.get("eagle")
    target_s, draft_s = measure_costs(ModelRunner(engine.target.model), runner)
    t = interpolate({k: v / target_s[1] for k, v in target_s.items()})
    costs = {"draft": interpolate({k: v / target_s[1] for k, v in draft_s.items()}
                                  or {1: 0.0, 2: 0.0})}
    traces: dict[str, list[Trace]] = {}
    if runner is not None:
        traces["draft"] = [trace(runner, case) for case in cases]
    step, read = drafter_costs(engine.target.model, {
        name: d for name, d in engine.drafters.items() if name in ("ngram", "suffix", "draft",
                                                                    "eagle")})
    note = ""
    if isinstance(head, EagleDrafter):
        costs["eagle"] = interpolate({1: step["eagle"], 64: step["eagle"] + 63 * read["eagle"]})
        traces["eagle"] = [head_trace(head, engine.target.model, case, HEAD_DEPTH,
                                      read["eagle"]) for case in cases]
        note = (f"; the head ({head.info.get('file')}, {head.info.get('kind')}): a step "
                f"{step['eagle']:.3f}, a prompt token {read['eagle']:.4f}")

    def policy(drafter: str, max_gamma: int) -> DraftPolicy:  # as the worker's calibration
        ratios = {k: t(k) for k in range(2, max_gamma + 2)}
        return DraftPolicy.calibrated(1.0, ratios, step.get(drafter), max_gamma,
                                      read.get(drafter))

    no_trace = [Trace([], [], 0.0)] * len(cases)
    rows = [(m.name, predict(cases, traces.get(m.model or "", no_trace), m, t,
                             costs.get(m.model or "", costs["draft"])))
            for m in methods(wanted, head_wanted, policy)
            if not m.model or m.model in traces]
    sys.stdout.write(
        f"Costs measured now (t(1) = {target_s[1] * 1e3:.0f} ms): t(k)/t(1) "
        + ", ".join(f"{k}: {t(k):.2f}" for k in sorted(target_s))
        + "; draft model forward over k tokens / t(1) "
        + ", ".join(f"{k}: {costs['draft'](k):.2f}" for k in sorted(draft_s)) + note + "\n\n"
        "Predicted speedup over plain (after the first token in brackets); predictions\n"
        "move with these costs, so compare settings within one replay.\n\n")
    sys.stdout.write(table(rows))
    return 0


def drafter_costs(target: Any, drafters: dict[str, Any]
                  ) -> tuple[dict[str, float], dict[str, float]]:
    """Each drafter's step and its reading of a prompt token (where it reads one), in
    ``t(1)``, as the worker's calibration measures them
    (:func:`engine.spec.calibration.measure`)."""
    slices = calibration.measure(target, drafters, "replay")
    while True:
        try:
            next(slices)
        except StopIteration as done:
            measured: calibration.Calibration = done.value
            break
    return dict(measured.step), dict(measured.read)


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
