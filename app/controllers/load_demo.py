"""The load demo: 1, 2 and 4 answers at once, each level plain and then speculative.

Contract: :meth:`LoadDemoController.run` runs the steps of :func:`app.load_demo.plan`
one after the other. A step sends all its answers at once (one :meth:`WorkerClient.ask`
each, which streams on its own asyncio task, so they are truly in flight together) and
waits for all of them before the next step starts. Every request is greedy, asks for a
cold answer (``anve.cache: "cold"``, as the side-by-side demo) and carries the step's
``speculation`` override (:func:`app.load_demo.speculation_for`). Times are measured
here on ``clock`` (the send, the end) and from the answer's timeline (its first token):
see :class:`app.load_demo.Answer`. Each finished answer emits :attr:`progressed`, each
finished step :attr:`level_measured`; then :attr:`run_finished` carries the whole
:class:`~app.load_demo.Report`.

:meth:`cancel` stops every answer in flight (the client ends each with ``stopped``) and
no further step starts; :attr:`run_stopped` then carries the steps measured so far. An
answer that fails (the worker unreachable, an error) stops the others in flight at once
and ends the run with :attr:`run_failed`. Either way nothing is left running and
:attr:`busy_changed` says ``False`` last.
"""

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from PySide6.QtCore import QObject, Signal

from app.client import COMPLETE, ERROR, STOPPED, AnswerRequest, AnswerResult, WorkerClient
from app.demo import DemoPrompt
from app.load_demo import (
    LEVELS,
    Answer,
    Measured,
    Report,
    Step,
    failure_text,
    plan,
    prompts_for,
    speculation_for,
)
from app.tasks import TaskSet
from engine.protocol import COLD

log = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS = 128


@dataclass(frozen=True)
class Progress:
    """How far the step in progress is: ``done`` of its ``count`` answers finished."""

    step: Step
    done: int
    count: int


@dataclass
class _Flight:
    """One answer in flight: when it was sent, and its result once it ends."""

    sent_s: float
    future: "asyncio.Future[tuple[float, AnswerResult]]"


class LoadDemoController(QObject):
    # ---- Signals -----------------------------------------------------------------
    run_started = Signal()
    """A run began (the report is empty again)."""
    step_started = Signal(object)
    """The :class:`~app.load_demo.Step` whose answers were just sent."""
    progressed = Signal(object)
    """A :class:`Progress`: sent at a step's start and after each of its answers ends."""
    level_measured = Signal(object)
    """A step's :class:`~app.load_demo.Measured` (all its answers complete)."""
    run_finished = Signal(object)
    """The whole :class:`~app.load_demo.Report`: every step was measured."""
    run_stopped = Signal(object)
    """The :class:`~app.load_demo.Report` so far: the run was stopped (:meth:`cancel`)."""
    run_failed = Signal(str)
    """Why the run stopped early (an answer failed, or the worker was unreachable)."""
    busy_changed = Signal(bool)
    """Whether a run is in progress."""

    def __init__(
        self, client: WorkerClient, parent: QObject | None = None, *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(parent)
        self.client = client
        self.busy = False
        self.report = Report()
        self.step: Step | None = None  # the step in progress
        self._clock = clock
        self._flights: dict[str, _Flight] = {}  # answer id -> the step's answer in flight
        self._stopping = False
        self._tasks = TaskSet(lambda what, exc: self.run_failed.emit(f"{what} failed: {exc}"))
        client.answer_finished.connect(self._finished)

    @property
    def in_flight(self) -> list[str]:
        """Ids of the answers sent and not yet ended."""
        return [rid for rid, f in self._flights.items() if not f.future.done()]

    async def wait(self) -> None:
        await self._tasks.wait()

    def run(self, prompts: Sequence[DemoPrompt], method: str,
            max_tokens: int = DEFAULT_MAX_TOKENS, levels: Sequence[int] = LEVELS) -> bool:
        """Start a run (False when one is already running or there is no prompt)."""
        if self.busy or not prompts or not levels:
            return False
        self._stopping = False
        self._set_busy(True)
        self._tasks.spawn(self._run(list(prompts), method, max_tokens, list(levels)),
                          "The load demo")
        return True

    def cancel(self) -> None:
        """Stop every answer in flight; no further step starts."""
        if not self.busy:
            return
        self._stopping = True
        for rid in self.in_flight:
            self.client.cancel(rid)

    def _set_busy(self, busy: bool) -> None:
        self.busy = busy
        self.busy_changed.emit(busy)

    async def _run(self, prompts: list[DemoPrompt], method: str, max_tokens: int,
                   levels: list[int]) -> None:
        self.report = Report()
        self.run_started.emit()
        try:
            for step in plan(levels):
                if self._stopping:
                    self.run_stopped.emit(self.report)
                    return
                results = await self._step(step, prompts, method, max_tokens)
                why = self._problem(step, [result for _, _, result in results])
                if why == STOPPED:
                    self.run_stopped.emit(self.report)
                    return
                if why is not None:
                    self.run_failed.emit(why)
                    return
                measured = Measured(step, tuple(_answer(sent, done, result)
                                                for sent, done, result in results))
                self.report = self.report.add(measured)
                log.info("load demo: %s: %s tok/s total, %d tokens in %.2f s",
                         step.describe(), measured.total_rate, measured.tokens,
                         measured.wall_s or 0.0)
                self.level_measured.emit(measured)
            self.run_finished.emit(self.report)
        finally:
            self.step = None
            self._flights.clear()
            self._set_busy(False)

    async def _step(
        self, step: Step, prompts: list[DemoPrompt], method: str, max_tokens: int
    ) -> list[tuple[float, float, AnswerResult]]:
        """Send the step's answers together; wait for every one to end."""
        loop = asyncio.get_running_loop()
        self.step = step
        self._flights.clear()
        for prompt in prompts_for(step.level, prompts):
            request = AnswerRequest([{"role": "user", "content": prompt.prompt}],
                                    temperature=0.0, max_tokens=max_tokens,
                                    speculation=speculation_for(step, method), cache=COLD)
            sent = self._clock()
            rid = self.client.ask(request)
            self._flights[rid] = _Flight(sent, loop.create_future())
        flights = list(self._flights.values())
        self.step_started.emit(step)
        self.progressed.emit(Progress(step, 0, len(flights)))
        ended = await asyncio.gather(*(f.future for f in flights))
        return [(f.sent_s, done, result) for f, (done, result) in zip(flights, ended, strict=True)]

    def _problem(self, step: Step, results: list[AnswerResult]) -> str | None:
        """Why the step's results cannot be used: a failure's words, :data:`STOPPED`
        (stopped by :meth:`cancel` or the client closing), or None when all completed."""
        failed = [r for r in results if r.outcome not in (COMPLETE, STOPPED)]
        if failed:
            first = next((r for r in failed if r.connection_lost), failed[0])
            return failure_text(step, first.message, lost=first.connection_lost,
                                refused=first.outcome == ERROR, code=first.code)
        if any(r.outcome == STOPPED for r in results):
            return STOPPED
        return None

    def _finished(self, rid: str, result: AnswerResult) -> None:
        flight = self._flights.get(rid)
        if flight is None or flight.future.done():
            return
        flight.future.set_result((self._clock(), result))
        if result.outcome not in (COMPLETE, STOPPED):  # no use waiting for the others
            log.warning("load demo: answer %s ended %s: %s", rid, result.outcome,
                        result.message)
            for other in self.in_flight:
                self.client.cancel(other)
        if self.step is not None:
            done = sum(f.future.done() for f in self._flights.values())
            self.progressed.emit(Progress(self.step, done, len(self._flights)))


def _answer(sent: float, done: float, result: AnswerResult) -> Answer:
    """One complete answer's measures: its first token from its timeline (seconds since
    the client sent it), its tokens and method from the worker's figures."""
    stats = result.stats
    first = float(result.timeline[0][0]) if result.timeline else None
    return Answer(sent, done, first, stats.completion_tokens, stats.method, stats.enabled,
                  stats.disabled_reason, stats.cache)
