"""The machine's own costs, and the drafting method they predict to be fastest.

Contract:

* :class:`Calibration` is a pure, immutable record of measured figures: ``t1`` (seconds
  of a target forward over one new token after a warm cache), ``ratios`` (``t(k) / t(1)``
  for k = 2..16), and per drafter its draft step cost and its own prompt reading cost
  per token, both as fractions of ``t1`` (a slow spell of the shared machine moves them
  alike). It is keyed by the machine (:func:`machine_identity`: CPU model, a hash of its
  flags, the native kernel variant) and the model files (:func:`model_identity`: name,
  size, modification time). :meth:`Calibration.fold` returns it with live figures mixed
  in (weight ``LIVE_WEIGHT`` per answer), so it follows the machine's speed.
* :func:`measure` is a generator: each ``next()`` runs one short slice (one forward of
  the target or one drafter call), so the worker's engine thread can give way to an
  answer between slices; it returns the :class:`Calibration` after about ``budget_s``
  seconds of measuring, reading its context aside (sizes are measured spread out, 2, 4,
  8, 16, 3, 5, ..., those of a short draft, 2..5, three times a round; the first four
  always, those the budget left out are interpolated by :meth:`Calibration.ratio_at`).
  Each t(k), draft step and prompt reading is measured against a t(1) taken just before
  it, and ``t1`` is the median of all of those: on a shared machine whose speed moves
  within seconds, a slow spell then slows both sides of a ratio. The ratios are then
  fitted non-decreasing in k (:func:`non_decreasing`).
* :func:`measure_t1` measures t(1) alone (a few forwards): a cached calibration whose t(1)
  is not within ``DRIFT`` of it (:func:`agrees`) is measured again, as the one cached
  may have been taken in a slow moment, or the machine's load may have changed since.
* :class:`Observations` holds the acceptance each method showed per kind of prompt
  (:func:`classify`: ``code``, ``editing``, ``summary``, ``chat``; a simple rule on the
  last question's text, since nothing upstream labels prompts) and the prompt and answer
  lengths per kind.
* :func:`predict` and :func:`choose` are pure functions of those figures: the predicted
  speed of each loaded method relative to plain decoding (the adaptive policy's model,
  :mod:`engine.spec.policy`, with the drafter's prompt reading spread over the answer), and
  the best one with a sentence saying why ("ngram: 1.20× predicted on this machine;
  draft model: 0.90×").
* :class:`CalibrationCache` keeps calibrations and observations in one JSON file in the
  data directory, the ``MAX_ENTRIES`` most recently saved; a file that cannot be read is
  ignored (and rewritten).

Priors, used only where nothing was measured yet: an acceptance of
``DraftPolicy.alpha_prior`` with the weight of one draft token, every asked draft found
(coverage 1), and an answer as long as its new prompt.
"""

import contextlib
import hashlib
import json
import logging
import os
import platform
import re
import time
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from engine.paths import ASSETS
from engine.spec.drafters import Drafter
from engine.spec.policy import (
    DraftPolicy,
    expected_tokens,
    on_line,
    ratio_between,
    within_slack,
)

log = logging.getLogger(__name__)

MAX_K = 16  # t(k) is measured for k = 1..MAX_K
CONTEXT = 128  # tokens in the cache the measured forwards continue
# sizes in the order measured (each after a t(1)): spread out, so a budget cut short
# still spans 2..16, and the sizes that verify a draft of up to four tokens (2..5) three
# times a round, since the policy's choice rests on them and one sample taken in a busy
# moment misled it (t(2)/t(1) = 0.73 on a machine where it is about 0.9-1.0)
ORDER = (2, 4, 8, 16, 3, 5, 2, 3, 4, 5, 6, 12, 10, 7, 2, 3, 4, 5, 14, 9, 11, 13, 15)
# the first SPAN sizes are always measured: extrapolated from 1 and 2 rows (where a step
# is bound by memory and a row is nearly free) t(16) came out 3-5 times too low
SPAN = 4
LIVE_WEIGHT = 0.2  # share of a calibration one answer's live figures replace
CHECK_PASSES = 7  # one-row forwards that check a cached calibration's t(1) at start
DRIFT = 1.3  # a cached t(1) further than this from the one measured at start is redone
MAX_ENTRIES = 8  # calibrations the cache file keeps, the most recently saved
OBSERVED_DECAY = 0.98  # per answer, for the acceptance evidence of a method and kind
OTHER_KINDS = 0.25  # weight of a method's evidence on other kinds of prompt, at most
# and the most draft tokens' worth (accepted + rejected) that evidence counts as: a prior
# for a kind the method has little evidence of, not a weight that outgrows the kind's own
BORROWED_DRAFTS = 8.0
KINDS = ("code", "editing", "summary", "chat")
VERSION = 2  # 2: t(1..16) always measured (1 could hold t(4..16) extrapolated from t(2))
PRIORS = ASSETS / "calibration"
PRIOR_SUFFIX = ".observations.json"
PRIOR_FORMAT = "anve-observations-1"
PRIOR_ANSWERS = 4.0  # answers' worth a shipped observation counts as, per method and kind
# generated tokens of a method's own timed answers on a kind at which its observed speed
# weighs as much as the speed the cost model predicts (see predict)
OBSERVED_TOKENS = 256.0
# How much faster than predicted a method whose answers this machine has not yet timed may
# turn out: auto ranks it up to that much higher (see choose)
UNTRIED = 0.05

_CODE = re.compile(r"```|^\s*(def |class |import |from \S+ import |#include|function |public |"
                   r"fn |SELECT |<\w+[ >])", re.MULTILINE)
_COMPLETE = re.compile(r"\b(complete|finish|implement|continue)\b", re.IGNORECASE)
_EDIT = re.compile(r"\b(add|rewrite|change|fix|make|refactor|update|rename|remove|convert|"
                   r"modify|edit|improve|replace|translate)\b", re.IGNORECASE)
_SUMMARY = re.compile(r"\b(summar\w*|minutes|list the|extract|quote|quoting|tl;dr|key points)\b",
                      re.IGNORECASE)
DOCUMENT_CHARS = 400  # a question this long that asks for a summary quotes a document


def classify(text: str) -> str:
    """The kind of a question: ``code`` (write or complete code), ``editing`` (change the
    code it quotes), ``summary`` (a document to summarise or quote from) or ``chat``."""
    if _CODE.search(text):
        head = text.split("\n", 1)[0]
        if _COMPLETE.search(head) or not _EDIT.search(head):
            return "code"
        return "editing"
    if len(text) >= DOCUMENT_CHARS and _SUMMARY.search(text):
        return "summary"
    return "chat"


# --- identity -------------------------------------------------------------------------


def cpu_fields(cpuinfo: str | None = None) -> dict[str, str]:
    """The first processor's fields of ``/proc/cpuinfo`` (or of ``cpuinfo``, its text):
    ``model name``, ``cpu family``, ``model``, ``flags``...; empty where unreadable."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        name, sep, value = line.partition(":")
        if sep:
            fields.setdefault(name.strip(), value.strip())
    return fields


def machine_identity(kernels: str | None = None) -> dict[str, str]:
    """CPU model, a hash of its feature flags and the native kernel variant that runs
    (``kernels``: the target's forward plan's, ``None`` on the torch reference)."""
    fields = cpu_fields()
    cpu = fields.get("model name") or platform.processor() or platform.machine()
    flags = " ".join(sorted(fields.get("flags", "").split()))
    identity = {"cpu": cpu, "flags": hashlib.sha256(flags.encode()).hexdigest()[:12],
                "threads": str(os.cpu_count() or 0), "kernels": kernels or "none"}
    return identity


def file_identity(path: Path | None) -> str:
    """Name, size and modification time of a model file, or ``-``."""
    if path is None:
        return "-"
    try:
        stat = path.stat()
    except OSError:
        return f"{path.name}:missing"
    return f"{path.name}:{stat.st_size}:{int(stat.st_mtime)}"


def model_identity(models: Iterable[Any]) -> list[str]:
    """One line per loaded model (``LoadedModel``): name, accel mode, file identity."""
    return [f"{m.name}|{getattr(m, 'accel', '')}|{getattr(m, 'sha256', None) or ''}|"
            f"{file_identity(getattr(m, 'gguf', None))}" for m in models if m is not None]


def cache_key(machine: Mapping[str, str], models: Sequence[str]) -> str:
    blob = json.dumps({"machine": dict(machine), "models": list(models)}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


# --- the measured figures -------------------------------------------------------------


@dataclass(frozen=True)
class Calibration:
    """Measured costs on one machine with one set of models (see the module)."""

    key: str
    t1: float
    ratios: Mapping[int, float]
    step: Mapping[str, float] = field(default_factory=dict)  # drafter -> step / t1
    read: Mapping[str, float] = field(default_factory=dict)  # drafter -> s per token / t1
    measured_at: float = 0.0
    source: str = "measured"  # "measured", "cache", or "live" once answers folded in
    answers: int = 0  # answers folded in since it was measured

    def ratio_at(self, k: int) -> float:
        """``t(k) / t(1)``: measured, else linear between measured sizes; beyond the
        longest, on the line through the two longest."""
        between = ratio_between(self.ratios, k)
        if between is not None:
            return between
        points = sorted([(1, 1.0), *self.ratios.items()])
        return 1.0 if len(points) < 2 else on_line(points[-2], points[-1], k)

    def verify_cost(self, k: int) -> float:
        return self.t1 * self.ratio_at(k)

    def step_s(self, drafter: str) -> float | None:
        share = self.step.get(drafter)
        return None if share is None else share * self.t1

    def fold(self, *, t1: float | None = None, ratios: Mapping[int, float] | None = None,
             step: Mapping[str, float] | None = None, weight: float = LIVE_WEIGHT
             ) -> "Calibration":
        """This calibration with one answer's live figures mixed in: ``t1`` seconds,
        ``ratios`` t(k)/t(1) and ``step`` (drafter -> seconds per draft step)."""
        new_t1 = self.t1 if t1 is None or t1 <= 0 else (1 - weight) * self.t1 + weight * t1
        mixed = dict(self.ratios)
        for k, r in (ratios or {}).items():
            if 2 <= k <= MAX_K and r > 0:
                mixed[k] = r if k not in mixed else (1 - weight) * mixed[k] + weight * r
        steps = dict(self.step)
        for name, seconds in (step or {}).items():
            if seconds is not None and seconds >= 0:
                share = seconds / new_t1
                steps[name] = share if name not in steps else (
                    (1 - weight) * steps[name] + weight * share)
        return replace(self, t1=new_t1, ratios=mixed, step=steps, source="live",
                       answers=self.answers + 1)

    def policy(self, drafter: str, max_gamma: int) -> DraftPolicy:
        """An adaptive policy starting from these figures for ``drafter``."""
        ratios = {k: r for k, r in self.ratios.items() if k <= max_gamma + 1}
        return DraftPolicy.calibrated(self.t1, ratios, self.step_s(drafter), max_gamma,
                                      self.read.get(drafter))

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["ratios"] = {str(k): v for k, v in self.ratios.items()}
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Calibration":
        ratios = {int(k): float(v) for k, v in dict(data["ratios"]).items()}
        return cls(str(data["key"]), float(data["t1"]), ratios,
                   {str(k): float(v) for k, v in dict(data.get("step", {})).items()},
                   {str(k): float(v) for k, v in dict(data.get("read", {})).items()},
                   float(data.get("measured_at", 0.0)), "cache", int(data.get("answers", 0)))

    def summary(self) -> dict[str, Any]:
        """The figures as the worker reports them (milliseconds and ratios)."""
        return {"t1_ms": round(self.t1 * 1000, 3),
                "ratios": {str(k): round(self.ratio_at(k), 3) for k in range(2, MAX_K + 1)},
                "step": {k: round(v, 4) for k, v in self.step.items()},
                "read_per_token": {k: round(v, 4) for k, v in self.read.items()},
                "measured_at": self.measured_at, "source": self.source,
                "answers_folded": self.answers}


# --- measuring ------------------------------------------------------------------------


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def non_decreasing(ratios: Mapping[int, float]) -> dict[int, float]:
    """``ratios`` (k -> t(k)/t(1)) fitted to the closest non-decreasing sequence in k
    (least squares, pool-adjacent-violators): more rows never cost less, so a size that
    measured dearer than a larger one was measured in a busy moment, and the pair is
    replaced by its mean. t(1) itself is not pooled, so t(2) may stay below it."""
    blocks: list[tuple[float, int]] = []  # (mean, sizes pooled), in increasing k
    for k in sorted(ratios):
        blocks.append((ratios[k], 1))
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (a, m), (b, n) = blocks[-2], blocks[-1]
            blocks[-2:] = [((a * m + b * n) / (m + n), m + n)]
    fitted = [mean for mean, n in blocks for _ in range(n)]
    return dict(zip(sorted(ratios), fitted, strict=True))


Timed = tuple[list[int], Callable[[int], float]]  # the context read, and a timed forward


def timed_forwards(target: Any, clock: Callable[[], float] = time.perf_counter
                   ) -> Generator[None, None, Timed]:
    """Read :data:`CONTEXT` tokens into a fresh cache of ``target`` and warm it up (a
    slice each); returns the context and a function timing one forward over ``k`` new
    tokens after it (seconds; the cache is cut back to the context afterwards). Reading
    the context costs more than the forwards of a check: :func:`measure_t1` and
    :func:`measure` take one already read (``timed``), so a cached calibration found
    stale is measured again without reading it twice."""
    from engine.spec.runner import ModelRunner

    vocab = int(target.config.vocab_size)
    runner = ModelRunner(target)
    context = [(100 + i % 24) % vocab for i in range(CONTEXT)]  # repeats: lookups find drafts
    runner.sync(context)
    yield

    def forward(k: int) -> float:
        began = clock()
        runner.forward([(300 + i) % vocab for i in range(k)], rows=k)
        elapsed = clock() - began
        runner.truncate(len(context))
        return elapsed

    forward(1)  # warm-up
    yield
    return context, forward


def measure_t1(target: Any, passes: int = CHECK_PASSES,
               clock: Callable[[], float] = time.perf_counter, timed: Timed | None = None,
               ) -> Generator[None, None, float]:
    """The target's t(1) now: the median of ``passes`` one-row forwards after the same
    context :func:`measure` uses, one slice a forward (``timed``: that context already
    read, see :func:`timed_forwards`). A worker compares it with a cached calibration's
    (:func:`agrees`) before trusting that calibration."""
    _, forward = timed if timed is not None else (yield from timed_forwards(target, clock))
    ones = []
    for _ in range(passes):
        ones.append(forward(1))
        yield
    return _median(ones)


def agrees(cached_t1: float, now_t1: float) -> bool:
    """Whether a cached calibration's t(1) is within :data:`DRIFT` of one measured now,
    either way. One measured in a slow moment (twice the machine's t(1) was seen when
    something else ran beside the worker's start) would make every t(k) measured live
    look cheap, and the machine may also have grown busier or quieter since."""
    return cached_t1 > 0 and now_t1 > 0 and 1 / DRIFT <= now_t1 / cached_t1 <= DRIFT


def measure(target: Any, drafters: Mapping[str, Drafter], key: str, budget_s: float = 4.0,
            clock: Callable[[], float] = time.perf_counter, max_rounds: int = 5,
            timed: Timed | None = None) -> Generator[None, None, Calibration]:
    """Measure the target's t(k), k = 1..16, and each drafter's step and prompt reading
    costs, one short slice per ``next()`` (see the module). ``target``: a loaded model
    (``LoadedModel.model``); ``drafters``: name -> drafter (``engine.spec.drafters``);
    ``timed``: the context already read (:func:`timed_forwards`, with the same ``clock``).
    The drafters' state is reset afterwards."""
    import torch

    from engine.spec.runner import ModelRunner
    from engine.spec.sampling import SamplingParams

    context, forward = timed if timed is not None else (yield from timed_forwards(target, clock))
    # every measured cost is paired with a t(1) taken just before it: a shared machine's
    # speed moves within seconds, and the ratio of two neighbours follows it where a ratio
    # to a t(1) of another moment does not
    ones: list[float] = []
    pairs: dict[int, list[float]] = {k: [] for k in ORDER}  # t(k) / t(1) samples

    def one() -> float:
        ones.append(forward(1))
        return ones[-1]

    start = clock()  # the budget is for measuring: reading the context may take seconds
    for _ in range(max_rounds):
        for k in ORDER:
            before = one()
            yield
            pairs[k].append(forward(k) / before)
            yield
            if clock() - start > budget_s * 0.75 and all(pairs[k] for k in ORDER[:SPAN]):
                break  # out of time: sizes not measured are interpolated
        else:
            continue
        break
    t1 = _median(ones)
    ratios = non_decreasing({k: _median(r) for k, r in pairs.items() if r})
    step: dict[str, float] = {}
    read: dict[str, float] = {}
    params, generator = SamplingParams(), torch.Generator().manual_seed(0)
    features: dict[tuple[int, ...], torch.Tensor | None] = {}  # per width the heads read
    for layers in dict.fromkeys(d.feature_layers for d in drafters.values() if d.wants_hidden):
        seeing = ModelRunner(target)
        seeing.keep_hidden(True, layers)
        seeing.sync(context[:-1])
        features[layers] = seeing.hidden
        yield
    for name, drafter in drafters.items():
        try:
            if drafter.wants_hidden:
                drafter.observe_hidden(features[drafter.feature_layers])
            if drafter.reads_prompt:
                before = one()
                began = clock()
                drafter.prefill(context)
                read[name] = (clock() - began) / (len(context) - 1) / before
                yield
            per_step = []
            for _ in range(3):
                before = one()
                began = clock()
                draft = drafter.propose(context, 4, params, generator)
                per_step.append((clock() - began) / max(1, draft.depth) / before)
                yield
            step[name] = _median(per_step)
        except Exception:  # one drafter failing leaves the others' figures
            log.exception("measuring the %s drafter failed", name)
        with contextlib.suppress(Exception):
            drafter.reset()
    return Calibration(key, t1, ratios, step, read, time.time(), "measured")


# --- what the methods showed ------------------------------------------------------------


@dataclass
class Seen:
    """Decayed evidence of one method on one kind of prompt."""

    accepted: float = 0.0  # draft tokens kept
    rejected: float = 0.0  # draft passes that ended on a rejected token
    asked: float = 0.0  # passes that asked the drafter for a draft
    found: float = 0.0  # of those, passes that got one
    answers: float = 0.0
    # the speed it showed on this machine, from answers that ran alone: tokens after each
    # answer's first, and the seconds of their passes (drafting and verifying) over t(1)
    tokens: float = 0.0
    cost: float = 0.0

    def add(self, other: "Seen", weight: float = 1.0) -> "Seen":
        return Seen(*(a + weight * b for a, b in zip(astuple(self), astuple(other),
                                                    strict=True)))

    def decayed(self, factor: float) -> "Seen":
        return Seen(*(factor * a for a in astuple(self)))


def astuple(seen: Seen) -> tuple[float, ...]:
    return (seen.accepted, seen.rejected, seen.asked, seen.found, seen.answers, seen.tokens,
            seen.cost)


@dataclass
class Lengths:
    """Decayed sums of the new prompt tokens and answer tokens of one kind."""

    prompt: float = 0.0
    answer: float = 0.0
    answers: float = 0.0


@dataclass
class Observations:
    """Per method and kind what answers showed (see the module); engine thread only."""

    seen: dict[str, dict[str, Seen]] = field(default_factory=dict)
    lengths: dict[str, Lengths] = field(default_factory=dict)

    def record(self, method: str, kind: str, answer: Seen, prompt_tokens: int,
               answer_tokens: int) -> None:
        kinds = self.seen.setdefault(method, {})
        kinds[kind] = kinds.get(kind, Seen()).decayed(OBSERVED_DECAY).add(answer)
        old = self.lengths.get(kind, Lengths())
        self.lengths[kind] = Lengths(OBSERVED_DECAY * old.prompt + prompt_tokens,
                                     OBSERVED_DECAY * old.answer + answer_tokens,
                                     OBSERVED_DECAY * old.answers + 1)

    def forget(self, method: str) -> None:
        self.seen.pop(method, None)

    def evidence(self, method: str, kind: str | None, borrowed: float = OTHER_KINDS) -> Seen:
        """The kind's own evidence (every kind's for ``None``) plus ``borrowed`` of the
        method's other kinds, scaled down as a whole where that share would count as more
        than :data:`BORROWED_DRAFTS` draft tokens.

        Acceptance differs by kind, and adaptive drafting drafts much where it pays and
        little where it does not, so a fixed share of the kinds where a method drafts much
        would outweigh the evidence of a kind where it drafts little and predict that
        kind's acceptance from the others (docs/measurements.md, 2026-12-07 21:48–). The
        other kinds are therefore a prior of bounded strength: they decide while a kind has
        almost no evidence of its own and hardly count once it has some."""
        own, others = Seen(), Seen()
        for name, seen in self.seen.get(method, {}).items():
            if kind in (None, name):
                own = own.add(seen)
            else:
                others = others.add(seen)
        drafts = others.accepted + others.rejected
        weight = borrowed if drafts <= BORROWED_DRAFTS else min(borrowed, BORROWED_DRAFTS / drafts)
        return own.add(others, weight)

    def typical(self, kind: str | None) -> tuple[float, float]:
        """Mean new prompt tokens and answer tokens of a kind (prior: equal lengths)."""
        found = [v for k, v in self.lengths.items() if kind in (None, k)]
        answers = sum(v.answers for v in found)
        if answers <= 0:
            return 1.0, 1.0
        return (sum(v.prompt for v in found) / answers,
                max(1.0, sum(v.answer for v in found) / answers))

    def scaled(self, answers: float) -> "Observations":
        """A copy in which no method and kind, and no kind's lengths, count as more than
        ``answers`` answers (each scaled down as a whole)."""
        seen = {m: {k: s.decayed(min(1.0, answers / s.answers)) if s.answers > 0 else s
                    for k, s in kinds.items()} for m, kinds in self.seen.items()}
        lengths = {k: Lengths(*(min(1.0, answers / v.answers) * x
                                for x in (v.prompt, v.answer, v.answers)))
                   if v.answers > 0 else v for k, v in self.lengths.items()}
        return Observations(seen, lengths)

    def without_speeds(self) -> "Observations":
        """A copy without the speeds the methods showed: those are the machine's own, while
        acceptance depends on the models and the text (what shipped observations keep)."""
        seen = {m: {k: replace(s, tokens=0.0, cost=0.0) for k, s in kinds.items()}
                for m, kinds in self.seen.items()}
        return Observations(seen, dict(self.lengths))

    def to_json(self) -> dict[str, Any]:
        return {"seen": {m: {k: asdict(s) for k, s in kinds.items()}
                         for m, kinds in self.seen.items()},
                "lengths": {k: asdict(v) for k, v in self.lengths.items()}}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Observations":
        seen = {str(m): {str(k): Seen(**s) for k, s in dict(kinds).items()}
                for m, kinds in dict(data.get("seen", {})).items()}
        lengths = {str(k): Lengths(**v) for k, v in dict(data.get("lengths", {})).items()}
        return cls(seen, lengths)


def shipped_observations(models: Sequence[str | None], folder: Path | None = None
                         ) -> Observations:
    """What the benchmark saw these models do, per method and kind of prompt, as a start
    for a fresh engine (``models``: the target's and the draft's names, ``None`` for no
    draft). Read from the first ``*.observations.json`` in ``folder`` (default
    ``assets/calibration/``, written by ``python -m engine.bench --observations-out``)
    made for the same models, scaled to at most :data:`PRIOR_ANSWERS` answers per method
    and kind, so live answers soon outweigh it. Acceptance depends on the models and the
    text, not on the machine; the machine's costs still come from its own calibration.
    Empty where no file matches; an unreadable one is logged and skipped."""
    folder = PRIORS if folder is None else folder
    wanted = list(models)
    for path in sorted(folder.glob("*" + PRIOR_SUFFIX)):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.get("format") != PRIOR_FORMAT or list(data.get("models", [])) != wanted:
                continue
            observations = Observations.from_json(data["observations"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("ignoring the shipped observations %s: %s", path, exc)
            continue
        log.info("starting from the observations in %s", path)
        return observations.scaled(PRIOR_ANSWERS).without_speeds()
    return Observations()


# --- predicting and choosing ------------------------------------------------------------


@dataclass(frozen=True)
class Prediction:
    """A method's predicted speed relative to plain decoding, and what it rests on."""

    method: str
    speedup: float
    alpha: float
    coverage: float
    draft_length: int
    step: float | None  # draft step / t(1)
    read: float  # the drafter's prompt reading per token / t(1)
    evidence: float  # draft tokens examined (accepted + rejections) behind alpha
    observed: float | None = None  # tokens per t(1) its timed answers showed, if any
    observed_tokens: float = 0.0  # the (decayed) tokens behind it

    def to_json(self) -> dict[str, Any]:
        return {"method": self.method, "speedup": round(self.speedup, 3),
                "alpha": round(self.alpha, 3), "coverage": round(self.coverage, 3),
                "draft_length": self.draft_length,
                "step": None if self.step is None else round(self.step, 4),
                "read_per_token": round(self.read, 4), "evidence": round(self.evidence, 1),
                "observed_speed": None if self.observed is None else round(self.observed, 3),
                "observed_tokens": round(self.observed_tokens, 1)}


def pass_speedup(alpha: float, coverage: float, step: float, ratio_at: Callable[[int], float],
                 max_gamma: int, others: int = 0) -> tuple[float, int]:
    """Best speed of adaptive drafting relative to plain (at least 1: the policy drafts
    nothing when nothing pays) and its draft length. Costs are in units of t(1); a pass
    that asks for a draft gets one with chance ``coverage`` (lookups find none at times)
    and pays ``step`` either way. With ``others`` answers sharing every pass (one row and
    one token each) it is the whole pass's speed, the drafting time stalling them all, and
    as the policy does (:func:`engine.spec.policy.within_slack`) no draft length may make
    their pass more than ``SHARED_SLACK`` longer."""
    plain = (others + 1) / ratio_at(others + 1)
    best, best_gamma = 1.0, 0
    for gamma in range(1, max_gamma + 1):
        drafted = step * (gamma + alpha**gamma) + ratio_at(others + gamma + 1)
        if not within_slack(drafted, ratio_at(others + 1), others):
            continue
        tokens = others + coverage * expected_tokens(alpha, gamma) + (1 - coverage)
        cost = coverage * drafted + (1 - coverage) * (ratio_at(others + 1) + step)
        if tokens / cost / plain > best * 1.02:
            best, best_gamma = tokens / cost / plain, gamma
    return best, best_gamma


def parts_step(calibration: Calibration, observations: Observations, parts: Sequence[str],
               kind: str | None, own: float | None, others: int = 0) -> float:
    """The draft step cost of a drafter made of ``parts`` (the first tried first, the
    last where it finds nothing: the hybrid's lookup, then its draft model).

    Its own measured step (``own``) is no guide: measuring drafts on a repetitive text,
    where the lookup always finds one. Alone, a pass costs the first part's step where
    that part found a draft as often as it did when it ran on its own on this kind
    (its observed coverage), else the dearest part's. Beside ``others`` answers any pass
    may fall to the dearest part while they wait, so that is its cost."""
    steps = [calibration.step.get(p, 0.0) for p in parts]
    dearest = max([own or 0.0, *steps])
    if others or len(parts) < 2:
        return dearest
    seen = observations.evidence(parts[0], kind)
    found = (seen.found + 1) / (seen.asked + 2)  # a prior of one pass found, one not
    return found * steps[0] + (1 - found) * dearest


def predict(calibration: Calibration, observations: Observations, methods: Iterable[str],
            kind: str | None, max_gamma: int, alpha_prior: float = DraftPolicy.alpha_prior,
            others: int = 0, parts: Mapping[str, Sequence[str]] | None = None,
            rereads: Mapping[str, int] | None = None, reads: Mapping[str, int] | None = None,
            ) -> list[Prediction]:
    """Predicted speed of each method (``off`` is left out) on ``kind``, best first; with
    ``others`` answers decoding in the same passes, the speed of all of them together:
    a drafter's own prompt reading then stalls every one, and a drafter made of
    ``parts`` (``Drafter.parts``) is costed as :func:`parts_step` says. ``rereads``:
    prompt tokens the target would read again for a method (an EAGLE head needs features
    its cached prompt lacks), each at a 16-row pass's cost per row. ``reads``: for the
    question at hand, the tokens a method's drafter would read itself before drafting
    (``Drafter.unread``: a draft model whose cache holds another conversation reads its
    whole window, however much of the prompt the target has cached); a method not in it
    reads the kind's typical new prompt tokens. Where a method's own
    answers on this kind ran alone on this machine, the speed they showed (``Seen.tokens``
    per ``Seen.cost`` of the kind's own evidence) is blended in, weighing as much as the model at
    :data:`OBSERVED_TOKENS` tokens."""
    target_read = calibration.ratio_at(16) / 16  # one prompt token, in t(1)
    prompt, answer = observations.typical(kind)
    out = []
    for method in methods:
        if method in ("off", "auto"):
            continue
        step = calibration.step.get(method)
        if parts and parts.get(method):
            step = parts_step(calibration, observations, parts[method], kind, step, others)
        seen = observations.evidence(method, kind)
        a = seen.accepted + alpha_prior
        alpha = a / (a + seen.rejected + 1 - alpha_prior)
        coverage = (seen.found + 1) / (seen.asked + 1)
        read = calibration.read.get(method, 0.0)
        speed, gamma = pass_speedup(alpha, coverage, step or 0.0, calibration.ratio_at,
                                    max_gamma, others)
        # what its own answers showed alone on this machine: every cost the model leaves
        # out is in it (a draft model's catch-up, a head's features), so as its tokens
        # grow it outweighs the model (not under load: those answers ran alone)
        # (on this kind alone: unlike acceptance, speed does not carry over, and a lookup
        # that ran at 1.9x on summaries quoting their document runs near plain on chat)
        timed = observations.evidence(method, kind, borrowed=0.0)
        tokens, cost = timed.tokens, timed.cost
        observed = tokens / cost if tokens > 0 and cost > 0 else None
        if observed is not None and not others:
            weight = tokens / (tokens + OBSERVED_TOKENS)
            speed = (1 - weight) * speed + weight * observed
        # an answer of `answer` tokens, the drafter reading its new tokens first
        # (and the target reading the prompt again where the method needs it)
        reading = ((reads or {}).get(method, prompt) * read
                   + (rereads or {}).get(method, 0) * target_read)
        speedup = answer / (answer / speed + reading * (1 + others))
        out.append(Prediction(method, speedup, alpha, coverage, gamma, step, read,
                              seen.accepted + seen.rejected, observed, tokens))
    return sorted(out, key=lambda p: -p.speedup)


@dataclass(frozen=True)
class Choice:
    """The method ``auto`` runs for a kind of prompt, and why."""

    method: str
    reason: str
    kind: str | None
    predictions: tuple[Prediction, ...] = ()

    @property
    def trial(self) -> bool:
        """Whether the method runs as a trial: not the best predicted, but close to it and
        not yet timed on this machine (:func:`choose`)."""
        return bool(self.predictions) and self.method != self.predictions[0].method

    def to_json(self) -> dict[str, Any]:
        return {"method": self.method, "reason": self.reason, "kind": self.kind,
                "predictions": [p.to_json() for p in self.predictions]}


NAMES = {"draft": "draft model", "eagle": "EAGLE head", "hybrid": "hybrid",
         "hybrid-eagle": "lookup, else EAGLE head"}


def hopeful(prediction: Prediction) -> float:
    """The speedup ``auto`` ranks a method by: its prediction, raised by up to
    :data:`UNTRIED` while this machine has timed few of its answers (by the share the cost
    model still has in :func:`predict`'s blend)."""
    untimed = OBSERVED_TOKENS / (prediction.observed_tokens + OBSERVED_TOKENS)
    return prediction.speedup * (1 + UNTRIED * untimed)


def choose(predictions: Sequence[Prediction], kind: str | None = None,
           fallback: str = "ngram", explore: bool = True) -> Choice:
    """The method with the best :func:`hopeful` speedup (with ``explore``; else the best
    predicted); with no predictions (nothing measured yet) ``fallback``.

    The cost model misses costs and gains by more than the gaps between its predictions
    (a hybrid's parts draft differently from their pooled acceptance; a draft model's
    catch-ups), and only a method's own timed answers show them. So a method predicted
    close to the best, but not yet timed here, is tried once on the kind, and from then
    on its observed speed takes part (the exploration bonus of optimism under
    uncertainty); without that, the first method to run would keep the kind. Under load
    the caller passes ``explore=False``: the answers sharing the trial's passes would pay
    for it, and answers that ran beside others are not timed anyway.

    Even when no method is predicted faster than plain decoding, the best one runs (the
    caller runs ``auto`` at adaptive length): its policy drafts only where the pass's
    figures say it pays and switches itself off within a few passes otherwise, at a
    bounded probing cost, and the answer's figures correct the calibration. Settling on
    plain decoding instead would freeze a calibration measured in a busy moment (a
    calibration taken while the machine was loaded put t(2)/t(1) at 17)."""
    if not predictions:
        return Choice(fallback, f"{fallback}: not measured on this machine yet", kind)
    ordered = sorted(predictions, key=lambda p: -p.speedup)
    parts = "; ".join(f"{NAMES.get(p.method, p.method)}: {p.speedup:.2f}×" for p in ordered)
    best = max(ordered, key=hopeful) if explore else ordered[0]
    name = NAMES.get(best.method, best.method)
    if best.speedup < 1.01:
        return Choice(best.method, f"no method predicted faster than plain decoding ({parts}); "
                      f"{name} drafts only where a pass pays and keeps measuring", kind,
                      tuple(ordered))
    if best is not ordered[0]:
        reason = (f"{name}: {best.speedup:.2f}×, close to the best predicted and not yet "
                  f"timed on this machine, so it is tried ({parts})")
        return Choice(best.method, reason, kind, tuple(ordered))
    first, *rest = parts.split("; ", 1)
    reason = f"{first} predicted on this machine" + (f"; {rest[0]}" if rest else "")
    return Choice(best.method, reason, kind, tuple(ordered))


# --- the cache file ---------------------------------------------------------------------


class CalibrationCache:
    """Calibrations and observations by key in one JSON file (``calibration.json``): the
    :data:`MAX_ENTRIES` most recently saved."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) and data.get("version") == VERSION else {}

    def load(self, key: str) -> tuple[Calibration | None, Observations]:
        entry = self._read().get("entries", {}).get(key)
        if not isinstance(entry, dict):
            return None, Observations()
        try:
            calibration = (None if entry.get("calibration") is None
                           else Calibration.from_json(entry["calibration"]))
            return calibration, Observations.from_json(entry.get("observations", {}))
        except (KeyError, TypeError, ValueError):
            log.warning("ignoring an unreadable calibration in %s", self.path)
            return None, Observations()

    def save(self, key: str, calibration: Calibration | None,
             observations: Observations) -> None:
        data = self._read() or {"version": VERSION, "entries": {}}
        entries = data["entries"]
        entries.pop(key, None)
        entries[key] = {
            "calibration": None if calibration is None else calibration.to_json(),
            "observations": observations.to_json(), "saved_at": time.time()}
        # entries are kept in the order saved (the newest last): models replaced or moved
        # leave keys no worker will read again, and the file would only grow
        data["entries"] = dict(list(entries.items())[-MAX_ENTRIES:])
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError as exc:
            log.warning("could not save the calibration to %s: %s", self.path, exc)
