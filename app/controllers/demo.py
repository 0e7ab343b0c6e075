"""The side-by-side speed demo: the same prompt plain, then speculative, then saved.

Contract: :meth:`DemoController.run` asks the worker twice, greedy, one after the
other (never both at once: on one machine they would share the CPU and the timings
would lie): first with ``speculation: {"method": "off"}``, then with the chosen
method. Both ask for a cold answer (``anve.cache: "cold"``): each reads the whole
prompt with nothing cached, and the suffix lookup does not remember either answer, so
both start from the same state and the speculative run cannot draft from the plain
run's answer (the worker confirms it in each answer). Both stream live
(:attr:`pane_updated`). When both are done it compares them (:func:`app.demo.compare`),
computes the speedup end to end from the worker's measured times
(:func:`app.demo.speedups`; the run's stored ``speedup``), stores the run with both
timelines (for the replay) and emits :attr:`run_finished`.
"""

import asyncio
import logging

from PySide6.QtCore import QObject, Signal

from app.client import COMPLETE, AnswerProgress, AnswerRequest, AnswerResult, WorkerClient
from app.demo import compare, speedups, timing
from app.models.demo_runs import DemoRunListModel
from app.store import AsyncStore, DemoRun, Store
from app.tasks import TaskSet
from engine.protocol import COLD

log = logging.getLogger(__name__)

PLAIN, SPECULATIVE = "plain", "speculative"
DEFAULT_MAX_TOKENS = 256


class DemoController(QObject):
    # ---- Signals -----------------------------------------------------------------
    run_started = Signal(str, str)
    """Prompt and method of a run that began."""
    pane_updated = Signal(str, object)
    """Side ("plain" or "speculative") and its :class:`AnswerProgress` (throttled)."""
    pane_finished = Signal(str, object)
    """Side and its :class:`AnswerResult`."""
    run_finished = Signal(object)
    """The stored :class:`DemoRun`."""
    run_failed = Signal(str)
    """Why a run stopped early."""
    busy_changed = Signal(bool)
    """Whether a run is in progress."""

    def __init__(self, db: AsyncStore, client: WorkerClient, parent: QObject | None = None):
        super().__init__(parent)
        self.db = db
        self.client = client
        self.runs = DemoRunListModel(self)
        self.busy = False
        self._sides: dict[str, str] = {}  # answer id -> side
        self._results: dict[str, asyncio.Future[AnswerResult]] = {}
        self._tasks = TaskSet(lambda what, exc: self.run_failed.emit(f"{what} failed: {exc}"))
        client.answer_progressed.connect(self._progressed)
        client.answer_finished.connect(self._finished)

    def load(self) -> None:
        self._tasks.spawn(self._load(), "Loading the demo runs")

    async def _load(self) -> None:
        self.runs.reset(await self.db.call(Store.demo_runs))

    async def wait(self) -> None:
        await self._tasks.wait()

    def run(self, prompt: str, method: str, max_tokens: int = DEFAULT_MAX_TOKENS) -> bool:
        if self.busy or not prompt.strip():
            return False
        self._set_busy(True)
        self._tasks.spawn(self._run(prompt.strip(), method, max_tokens), "The demo run")
        return True

    def cancel(self) -> None:
        for rid in list(self._sides):
            self.client.cancel(rid)

    def _set_busy(self, busy: bool) -> None:
        self.busy = busy
        self.busy_changed.emit(busy)

    async def _run(self, prompt: str, method: str, max_tokens: int) -> None:
        self.run_started.emit(prompt, method)
        try:
            plain = await self._side(PLAIN, prompt, "off", max_tokens)
            if plain.outcome != COMPLETE:
                self.run_failed.emit(f"The plain run did not finish: {plain.message}")
                return
            fast = await self._side(SPECULATIVE, prompt, method, max_tokens)
            if fast.outcome != COMPLETE:
                self.run_failed.emit(f"The speculative run did not finish: {fast.message}")
                return
            self.run_finished.emit(await self._save(prompt, method, plain, fast))
        finally:
            self._set_busy(False)

    async def _side(self, side: str, prompt: str, method: str, max_tokens: int) -> AnswerResult:
        request = AnswerRequest([{"role": "user", "content": prompt}], temperature=0.0,
                                max_tokens=max_tokens, speculation={"method": method},
                                cache=COLD)
        rid = self.client.ask(request)
        self._sides[rid] = side
        future = self._results[rid] = asyncio.get_running_loop().create_future()
        try:
            return await future
        finally:
            self._sides.pop(rid, None)
            self._results.pop(rid, None)

    async def _save(
        self, prompt: str, method: str, plain: AnswerResult, fast: AnswerResult
    ) -> DemoRun:
        same = compare(plain.text, fast.text, plain.stats.completion_tokens,
                       fast.stats.completion_tokens, plain.stats.token_ids, fast.stats.token_ids)
        ratio = speedups(timing(plain.stats, plain.timeline),
                         timing(fast.stats, fast.timeline)).total  # end to end
        sides = [
            {"text": r.text, "stats": r.stats.to_dict(), "timeline": r.timeline,
             "pieces": r.pieces}
            for r in (plain, fast)
        ]
        run = await self.db.call(Store.add_demo_run, prompt, method, sides[0], sides[1],
                                 same.identical, same.index, ratio)
        self.runs.prepend(run)
        log.info("demo run %d: %s, speedup %s, identical %s", run.id, method, ratio,
                 same.identical)
        return run

    def _progressed(self, rid: str, progress: AnswerProgress) -> None:
        side = self._sides.get(rid)
        if side is not None:
            self.pane_updated.emit(side, progress)

    def _finished(self, rid: str, result: AnswerResult) -> None:
        side = self._sides.get(rid)
        if side is None:
            return
        self.pane_finished.emit(side, result)
        future = self._results.get(rid)
        if future is not None and not future.done():
            future.set_result(result)
