"""The load demo's plan and arithmetic: 1, 2 and 4 answers at once, plain and speculative.
No Qt here.

Contract:

* :func:`plan` lists the steps in the order they run: each level of simultaneous answers
  (:data:`LEVELS`), first with speculation off, then on (plain first, as the
  side-by-side demo). :func:`prompts_for` gives a level's prompts: the shipped demo
  prompts in order, cycling when a level has more answers than there are prompts.
* :func:`speculation_for` is a step's ``speculation`` override: ``{"method": "off"}``,
  or the method the speculative side asks for, which :func:`speculative_method` reads
  from the worker's setting (its default method, as the side-by-side demo picks by
  default). Every request asks for a cold answer (:data:`engine.protocol.COLD`), as the
  side-by-side demo does: :data:`FAIRNESS` says so in words, :func:`start_text` checks
  the worker confirmed it.
* Times are the client's own (:class:`Answer`): when the request was sent, when its
  first token arrived, when the answer finished. An answer's speed is its tokens over
  the time from its send to its end (end to end); a level's total speed
  (:attr:`Measured.total_rate`) is all its answers' tokens over the wall time from the
  first send to the last end. :meth:`Report.ratio` divides the speculative total by
  the plain one.
* :func:`progress_text`, :func:`level_text` (:func:`headline_text`: the busiest level
  measured), :func:`table_rows`, :func:`ran_text` and :func:`failure_text` say in words
  what runs, what was measured, which method ran and why a run stopped.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from app.answer import method_name
from engine.protocol import COLD

LEVELS = (1, 2, 4)
"""How many answers run at once, level by level (the worker decodes up to 4 together)."""
FALLBACK_METHOD = "draft"  # asked for before the worker said its setting (the demo's too)
AUTO = "auto"

FAIRNESS = ("Every answer starts cold, as in the side-by-side demo: it reads its whole prompt, "
            "reuses nothing cached, and cannot draft from another answer (the suffix lookup "
            "remembers none of them).")
TABLE_HEADER = ("At once", "Total, off → on", "Speedup", "Each answer", "Slowest first token")
"""The result table's columns; each pair of figures is without → with speculation."""

T = TypeVar("T")


@dataclass(frozen=True)
class Step:
    """One run of the demo: ``level`` answers at once, speculation on or off."""

    level: int
    speculative: bool

    def describe(self) -> str:
        """E.g. "2 answers at once, speculation on"."""
        return f"{at_once(self.level)}, speculation {'on' if self.speculative else 'off'}"


def at_once(level: int) -> str:
    return f"{level} answer{'' if level == 1 else 's'} at once"


def plan(levels: Sequence[int] = LEVELS) -> list[Step]:
    """Each level in turn, plain then speculative."""
    return [Step(level, speculative) for level in levels for speculative in (False, True)]


def prompts_for(level: int, prompts: Sequence[T]) -> list[T]:
    """``level`` prompts: the first ones, cycling when there are fewer prompts than that."""
    if not prompts:
        raise ValueError("the load demo needs at least one prompt")
    return [prompts[i % len(prompts)] for i in range(level)]


def speculative_method(setting: Mapping[str, Any] | None) -> str:
    """The method the speculative side asks for: the worker's default method, else (when
    that is off) its automatic choice or first method, else :data:`FALLBACK_METHOD`."""
    if not setting:
        return FALLBACK_METHOD
    methods = [m for m in setting.get("available_methods") or () if m != "off"]
    method = setting.get("method")
    if isinstance(method, str) and method != "off" and (not methods or method in methods):
        return method
    if AUTO in methods:
        return AUTO
    return methods[0] if methods else FALLBACK_METHOD


def asked_name(method: str) -> str:
    """The method asked for, in words ("auto" is the worker's choice per answer)."""
    if method == AUTO:
        return "auto (the one predicted fastest)"
    return method_name(method)


def speculation_for(step: Step, method: str) -> dict[str, str]:
    """The request's ``speculation`` override for ``step``."""
    return {"method": method if step.speculative else "off"}


@dataclass(frozen=True)
class Answer:
    """One answer as the client measured it (seconds on the client's clock).

    ``first_token_s`` is the time from the send to its first token (``None``: no token).
    The rest is what the worker said it ran (``method``, ``enabled``, ...).
    """

    sent_s: float
    done_s: float
    first_token_s: float | None
    tokens: int
    method: str = "unknown"
    enabled: bool = False
    disabled_reason: str | None = None
    cache: str | None = None

    @property
    def elapsed_s(self) -> float:
        return self.done_s - self.sent_s

    @property
    def rate(self) -> float | None:
        """Tokens per second, end to end (from the send to the last token)."""
        if self.tokens < 1 or self.elapsed_s <= 0:
            return None
        return self.tokens / self.elapsed_s


@dataclass(frozen=True)
class Measured:
    """One step's answers, all complete."""

    step: Step
    answers: tuple[Answer, ...]

    @property
    def wall_s(self) -> float | None:
        """From the first send to the last end."""
        if not self.answers:
            return None
        return max(a.done_s for a in self.answers) - min(a.sent_s for a in self.answers)

    @property
    def tokens(self) -> int:
        return sum(a.tokens for a in self.answers)

    @property
    def total_rate(self) -> float | None:
        """All answers' tokens per second of wall time."""
        wall = self.wall_s
        if not self.tokens or not wall or wall <= 0:
            return None
        return self.tokens / wall

    @property
    def answer_rates(self) -> list[float]:
        """Each answer's own speed (answers that measured one), in answer order."""
        return [r for r in (a.rate for a in self.answers) if r is not None]

    @property
    def answer_rate(self) -> float | None:
        """The mean of the answers' own speeds."""
        rates = self.answer_rates
        return sum(rates) / len(rates) if rates else None

    @property
    def worst_first_token_s(self) -> float | None:
        """The slowest first token of the step (answers that had one)."""
        firsts = [a.first_token_s for a in self.answers if a.first_token_s is not None]
        return max(firsts) if firsts else None


@dataclass(frozen=True)
class Report:
    """The steps measured so far, in the order they ran."""

    measured: tuple[Measured, ...] = ()

    def add(self, measured: Measured) -> "Report":
        return Report((*self.measured, measured))

    def get(self, level: int, speculative: bool) -> Measured | None:
        for m in self.measured:
            if m.step == Step(level, speculative):
                return m
        return None

    @property
    def levels(self) -> list[int]:
        """Levels with at least one step measured, in the order they ran."""
        return list(dict.fromkeys(m.step.level for m in self.measured))

    def ratio(self, level: int) -> float | None:
        """How many times more tokens per second the level made with speculation."""
        plain, fast = self.get(level, False), self.get(level, True)
        if plain is None or fast is None or not plain.total_rate or not fast.total_rate:
            return None
        return fast.total_rate / plain.total_rate

    @property
    def speculative_answers(self) -> list[Answer]:
        return [a for m in self.measured if m.step.speculative for a in m.answers]


def rate_text(rate: float | None) -> str:
    """Tokens per second in the demo's precision (one decimal below 10)."""
    if rate is None:
        return "–"
    return f"{rate:.1f}" if rate < 10 else f"{rate:.0f}"


def seconds_text(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f} s"


def progress_text(step: Step, done: int, count: int) -> str:
    """E.g. "2 answers at once, speculation on: 1 of 2 answers done"."""
    return f"{step.describe()}: {done} of {count} answer{'' if count == 1 else 's'} done"


def level_text(report: Report, level: int) -> str:
    """One line per level, e.g. "4 answers at once: 41 tok/s total with speculation, 36
    without (1.14×); each answer 10 tok/s (9.0 without); first token within 0.40 s (0.35 s
    without)". A mode not measured yet is said to be."""
    plain, fast = report.get(level, False), report.get(level, True)
    head = at_once(level)
    if plain is not None and fast is None:
        return (f"{head}: {rate_text(plain.total_rate)} tok/s total without speculation "
                f"(with speculation: not measured); each answer "
                f"{rate_text(plain.answer_rate)} tok/s; first token within "
                f"{seconds_text(plain.worst_first_token_s)}")
    if fast is None:
        return f"{head}: not measured"
    if plain is None:
        return (f"{head}: {rate_text(fast.total_rate)} tok/s total with speculation "
                f"(without: not measured); each answer {rate_text(fast.answer_rate)} tok/s; "
                f"first token within {seconds_text(fast.worst_first_token_s)}")
    ratio = report.ratio(level)
    times = f" ({ratio:.2f}×)" if ratio else ""
    return (f"{head}: {rate_text(fast.total_rate)} tok/s total with speculation, "
            f"{rate_text(plain.total_rate)} without{times}; each answer "
            f"{rate_text(fast.answer_rate)} tok/s ({rate_text(plain.answer_rate)} without); "
            f"first token within {seconds_text(fast.worst_first_token_s)} "
            f"({seconds_text(plain.worst_first_token_s)} without)")


def headline_text(report: Report) -> str:
    """:func:`level_text` of the most answers at once measured both ways (else of the
    last level measured; "" when none is)."""
    both = [n for n in report.levels if report.ratio(n) is not None]
    if both:
        return level_text(report, max(both))
    return level_text(report, report.levels[-1]) if report.levels else ""


def _pair(plain: str, fast: str, unit: str) -> str:
    """ "plain → fast unit", or "–" when neither was measured."""
    return "–" if plain == fast == "–" else f"{plain} → {fast}{unit}"


def table_rows(report: Report, levels: Sequence[int] = LEVELS) -> list[tuple[str, ...]]:
    """One row per level under :data:`TABLE_HEADER` ("–" where not measured)."""
    rows: list[tuple[str, ...]] = []
    for level in levels:
        plain, fast = report.get(level, False), report.get(level, True)
        ratio = report.ratio(level)
        totals = [rate_text(m.total_rate) if m else "–" for m in (plain, fast)]
        each = [rate_text(m.answer_rate) if m else "–" for m in (plain, fast)]
        firsts = [f"{m.worst_first_token_s:.2f}" if m and m.worst_first_token_s is not None
                  else "–" for m in (plain, fast)]
        rows.append((str(level), _pair(totals[0], totals[1], " tok/s"),
                     "–" if ratio is None else f"{ratio:.2f}×",
                     _pair(each[0], each[1], " tok/s"), _pair(firsts[0], firsts[1], " s")))
    return rows


def ran_text(report: Report, asked: str) -> str:
    """Which method the speculative answers ran (the worker's word for each answer)."""
    answers = report.speculative_answers
    if not answers:
        return f"With speculation, the demo asks for: {asked_name(asked)}."
    off = [a for a in answers if not a.enabled and a.method not in ("unknown", "")]
    ran = sorted({a.method for a in answers if a.enabled})
    if not ran and not off:
        return f"Method asked for: {asked_name(asked)} (the worker did not say which ran)."
    parts = []
    if ran:
        parts.append("Speculative answers ran with " + ", ".join(method_name(m) for m in ran))
    if off:
        busy = any(a.disabled_reason == "load" for a in off)
        why = " (the appliance was busy)" if busy else ""
        parts.append(f"speculation was off for {len(off)} of {len(answers)} of them{why}")
    return "; ".join(parts) + "."


def start_text(report: Report) -> tuple[str, bool]:
    """Whether every answer measured started cold, in words, and whether it did."""
    answers = [a for m in report.measured for a in m.answers]
    warm = [a for a in answers if a.cache != COLD]
    if not warm:
        return FAIRNESS, True
    return (f"The worker did not confirm a cold start for {len(warm)} of {len(answers)} "
            "answers: cached prompts or earlier answers may have helped some of them.", False)


def failure_text(step: Step, message: str, *, lost: bool, refused: bool, code: str = "") -> str:
    """Why a step stopped: the worker could not be reached (``lost``), refused an answer
    (``refused``, with its error ``code``), or ended one early."""
    where = f"at {step.describe()}"
    if lost:
        return (f"The worker could not be reached {where} ({message}). Check that it is "
                "running; the results so far are kept.")
    if refused:
        detail = f" [{code}]" if code else ""
        return f"The worker refused an answer {where}: {message}{detail}"
    return f"An answer did not finish {where}: {message}"
