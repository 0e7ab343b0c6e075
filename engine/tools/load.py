"""The load benchmark: several answers at once, through the worker's own scheduler.

``python -m engine.bench --concurrency 1,2,4`` answers the benchmark's prompts (one per
kind, so four; repeated where more answers run at once) ``c`` at a time for each
concurrency ``c``, with speculation off and on (``auto``, the worker's default), through
the same :class:`~engine.worker.scheduler.Scheduler` the worker runs (continuous
batching, :mod:`engine.spec.batch`), in this process and on the same loaded models. Every
prompt is answered once before anything is timed, so as in an office where staff come
back to their conversations, the prompts are cached.

Per concurrency and mode: total tokens per second (all answers' tokens over the rounds'
wall time; at least two rounds per level, ``--rounds``, the two modes taking turns round
by round in ABBA order, each round starting with an empty suffix memory), the ratio to one
answer's plain tokens per second (the ``c = 1``, off figure of the same run), each
answer's own tokens per second and its time to the first token from its submission, the
passes that served several answers, and whether every answer's token ids equal the plain
answer served alone; and each round's on ÷ off ratio, which shows how far one total moves
with the machine. Greedy, as the benchmark.
"""

import asyncio
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from engine.errors import EngineError
from engine.protocol import Completion, TextChunk
from engine.spec.drafters.suffix import SuffixDrafter
from engine.spec.sampling import SamplingParams
from engine.spec.session import ADAPTIVE, AUTO, ChatEngine
from engine.worker.metrics import Metrics
from engine.worker.scheduler import Job, Scheduler
from engine.worker.schema import ChatRequest
from engine.worker.settings import Decision, SpeculationSettings

MODES = {"off": Decision("off", None), "on": Decision(AUTO, ADAPTIVE)}


@dataclass
class Answer:
    """One answer of a round, timed from its submission."""

    tokens: tuple[int, ...]
    first_s: float | None
    seconds: float
    method: str
    cached: int  # prompt tokens found cached
    prompt: int

    @property
    def tokens_per_s(self) -> float:
        return len(self.tokens) / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Level:
    """Every round of one concurrency and mode."""

    concurrency: int
    mode: str
    answers: list[Answer] = field(default_factory=list)
    wall_s: float = 0.0
    round_s: list[float] = field(default_factory=list)  # each round's wall time
    identical: bool = True

    @property
    def total_tokens_per_s(self) -> float:
        return sum(len(a.tokens) for a in self.answers) / self.wall_s if self.wall_s else 0.0


def parse_levels(text: str) -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]``; a clear error for anything else."""
    try:
        levels = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"--concurrency takes numbers like 1,2,4, not {text!r}") from None
    if not levels or any(c < 1 for c in levels):
        raise ValueError(f"--concurrency takes positive numbers like 1,2,4, not {text!r}")
    return sorted(set(levels))


def check_rounds(rounds: int) -> None:
    """A clear error for fewer than two rounds a level (``--rounds``)."""
    if rounds < 2:
        raise ValueError(f"--rounds: the load benchmark needs at least 2 rounds a level, "
                         f"not {rounds}")


async def _answer(scheduler: Scheduler, messages: list[dict[str, str]], decision: Decision,
                  max_tokens: int) -> Answer:
    request = ChatRequest(messages, SamplingParams(), max_tokens=max_tokens)
    job = Job(request, decision, asyncio.get_running_loop())
    start = time.perf_counter()
    scheduler.submit(job)
    first = None
    while True:
        event = await job.events.get()
        if isinstance(event, EngineError):
            raise event
        if isinstance(event, TextChunk) and event.token_ids and first is None:
            first = time.perf_counter() - start
        if isinstance(event, Completion):
            return Answer(event.token_ids, first, time.perf_counter() - start,
                          event.stats.method, event.stats.cached_tokens,
                          event.stats.prompt_tokens)


def forget_answers(engine: ChatEngine) -> None:
    """A new, empty office memory for the suffix lookup in every slot, so no answer drafts
    from the same prompt's answer of an earlier level (called while no answer runs)."""
    fresh = SuffixDrafter()
    for slot in engine.slots:
        slot.drafters["suffix"] = fresh


async def _levels(engine: ChatEngine, scheduler: Scheduler,
                  prompts: list[list[dict[str, str]]], levels: list[int], max_tokens: int,
                  rounds: int) -> list[Level]:
    plain: list[tuple[int, ...]] = []
    for messages in prompts:  # cache every prompt; the answers alone are the reference
        plain.append((await _answer(scheduler, messages, MODES["off"], max_tokens)).tokens)
    out: list[Level] = []
    for concurrency in levels:
        count = max(len(prompts), rounds * concurrency)  # every prompt, `rounds` at least
        both = {mode: Level(concurrency, mode) for mode in MODES}
        for round_, start in enumerate(range(0, count, concurrency)):
            picked = [i % len(prompts) for i in range(start, min(start + concurrency, count))]
            # the modes take turns round by round, in ABBA order, so a machine whose speed
            # drifts during the level slows both alike
            order = list(MODES) if round_ % 2 == 0 else list(reversed(MODES))
            for mode in order:
                forget_answers(engine)  # nothing drafts from the other mode's answers
                level = both[mode]
                began = time.perf_counter()
                answers = await asyncio.gather(*(
                    _answer(scheduler, prompts[i], MODES[mode], max_tokens) for i in picked))
                level.round_s.append(time.perf_counter() - began)
                level.wall_s += level.round_s[-1]
                level.answers += answers
                level.identical &= all(a.tokens == plain[i]
                                       for a, i in zip(answers, picked, strict=True))
        out += both.values()
    return out


def run_load(engine: ChatEngine, prompts: list[str], levels: list[int],
             max_tokens: int, rounds: int = 2) -> dict[str, Any]:
    """The load benchmark on ``engine`` (see the module), at least ``rounds`` rounds a
    level and mode; the result as JSON data."""
    check_rounds(rounds)
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "calibration.json"
        for _ in engine.calibrate(cache):  # what the worker measures at start, measured once
            pass
        metrics = Metrics()
        scheduler = Scheduler(lambda progress: engine, SpeculationSettings(), metrics,
                              calibration_cache=str(cache), max_batch=max(levels))
        scheduler.start()
        try:
            while scheduler.status.state == "loading" or scheduler.calibrating:
                time.sleep(0.01)  # the engine thread reads the cached calibration
            if scheduler.status.state != "ready":
                raise RuntimeError(f"the scheduler did not start: {scheduler.status.message}")
            messages = [[{"role": "user", "content": p}] for p in prompts]
            results = asyncio.run(_levels(engine, scheduler, messages, levels, max_tokens,
                                          rounds))
        finally:
            scheduler.stop()
    slots = scheduler.max_batch
    base = next(r for r in results if r.concurrency == min(levels) and r.mode == "off")
    one = base.total_tokens_per_s if base.concurrency == 1 else None
    rows = []
    for level in results:
        firsts = [a.first_s for a in level.answers if a.first_s is not None]
        rows.append({
            "concurrency": level.concurrency, "mode": level.mode,
            "answers": len(level.answers),
            "methods": sorted({a.method for a in level.answers}),
            "total_tokens_per_s": level.total_tokens_per_s,
            "vs_one_plain": None if one is None else level.total_tokens_per_s / one,
            "per_answer_tokens_per_s": [a.tokens_per_s for a in level.answers],
            "first_token_s": [a.first_s for a in level.answers],
            "worst_first_token_s": max(firsts) if firsts else None,
            "prompt_tokens_cached": sum(a.cached for a in level.answers)
            / max(1, sum(a.prompt for a in level.answers)),
            "identical": level.identical,
            "round_s": level.round_s,
            "answers_detail": [asdict(a) for a in level.answers],
        })
    return {"slots": slots, "levels": rows, "batched_passes": _batched_passes(metrics)}


def _batched_passes(metrics: Metrics) -> dict[str, float]:
    """Passes by how many answers they served, from the histogram's buckets."""
    samples = next(iter(metrics.answers_per_pass.collect())).samples
    cumulative = {s.labels["le"]: s.value for s in samples if s.name.endswith("_bucket")}
    out, below = {}, 0.0
    for le, count in cumulative.items():
        if count > below:
            out[le] = count - below
        below = count
    return out


def load_markdown(data: dict[str, Any]) -> str:
    """The load benchmark's table."""
    cached = min(row["prompt_tokens_cached"] for row in data["levels"])
    lines = [f"Several answers at once ({data['slots']} slots; at least {cached:.0%} of "
             "every level's prompt tokens found cached; greedy)", "",
             "| answers at once | speculation | methods | total tok/s | vs one plain answer | "
             "per answer tok/s (min–max) | worst first token | identical |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in data["levels"]:
        per = row["per_answer_tokens_per_s"]
        ratio = row["vs_one_plain"]
        worst = row["worst_first_token_s"]
        lines.append(
            f"| {row['concurrency']} | {row['mode']} | {', '.join(row['methods'])} | "
            f"{row['total_tokens_per_s']:.1f} | {'–' if ratio is None else f'{ratio:.2f}×'} | "
            f"{min(per):.1f}–{max(per):.1f} | {'–' if worst is None else f'{worst:.2f} s'} | "
            f"{'yes' if row['identical'] else 'NO'} |")
    ratios = round_ratios(data["levels"])
    if ratios:
        lines += ["", "Speculation on ÷ off, round by round (the same answers' wall times): "
                  + "; ".join(f"{c} at once: " + ", ".join(f"{r:.2f}" for r in rs)
                              for c, rs in ratios.items()) + "."]
    return "\n".join(lines) + "\n"


def round_ratios(levels: list[dict[str, Any]]) -> dict[int, list[float]]:
    """Per concurrency, off's wall time over on's for each round: the same prompts
    answered the same way in both modes, so the ratio of their speeds, round by round
    (how much one run's total moves with the machine)."""
    out: dict[int, list[float]] = {}
    for off in (r for r in levels if r["mode"] == "off" and r.get("round_s")):
        on = next((r for r in levels if r["mode"] == "on"
                   and r["concurrency"] == off["concurrency"]), None)
        if on is not None and on.get("round_s"):
            out[off["concurrency"]] = [a / b for a, b in zip(off["round_s"], on["round_s"],
                                                             strict=False) if b > 0]
    return out
