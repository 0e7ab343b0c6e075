"""One engine thread: it loads the models, then serves answers, several at once.

Contract:

* :meth:`Scheduler.start` returns at once. The thread loads the engine (``status``
  says ``loading`` with progress 0-1 and a message, then ``ready``, or ``error`` with
  the reason) and then serves jobs in arrival order, up to ``max_batch`` of them
  together (continuous batching, :mod:`engine.spec.batch`): each answer runs in a slot
  of the engine (:meth:`ChatEngine.open_slots`), every target pass carries the rows of
  all running answers, a new job joins at the next pass (its prompt read in short
  chunks between the others' passes) and a finished or stopped one leaves at once. An
  engine without slots (``open_slots`` returns 1) answers one job at a time.
* :meth:`Scheduler.submit` is called on the event loop and never blocks it. A job's
  events arrive on ``job.events`` through ``loop.call_soon_threadsafe``: a
  :class:`Started` once the request is accepted (prompt encoded and fits), the
  engine's events (``ContextWindow`` when a rolling window left messages out,
  ``PromptProgress`` while it reads a long prompt, ``TextChunk`` s, one ``Completion``),
  or an :class:`EngineError` instead.
* A job that has to wait (every slot busy) gets :class:`Queued` events: how many
  answers are ahead of it, at once and whenever that number changes (a job served at
  once gets none).
* :meth:`Scheduler.abandon` frees a job's slot at once: a waiting job leaves the queue;
  a running one is cancelled through its ``threading.Event``, which the decoding loop
  checks before every target pass and between chunks of a long prompt; the others in
  its batch go on.
* :meth:`Scheduler.reload_head` asks the thread to swap in a newly installed draft head
  once no answer runs (no new one starts meanwhile), then to publish the methods it
  now offers;
  the event it returns is set once that is done (or failed, logged; or the worker stops).
* Once loaded, an engine that offers ``calibrate`` (:meth:`ChatEngine.calibrate`) is
  calibrated in the background: one short slice at a time, only while no answer waits
  or runs, so calibration never slows an answer by more than one slice.
  :attr:`Scheduler.report` then holds the engine's ``speculation_report()`` (the
  calibration and the automatic method's choice), refreshed after every answer.
* The engine is not thread-safe. It is touched from this thread, and from the lanes of
  its batch, which run one at a time while this thread waits.
* A client that reads slowly stalls nothing: events queue on the event loop.
"""

import asyncio
import functools
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from engine.errors import BadRequestError, EngineError
from engine.models.registry import Progress
from engine.protocol import Completion, ContextWindow, PromptProgress, TextChunk
from engine.spec.batch import Batch, Lane
from engine.worker.metrics import Metrics
from engine.worker.schema import ChatRequest
from engine.worker.settings import ADAPTIVE, Decision, DraftLength, SpeculationSettings

log = logging.getLogger(__name__)

DEFAULT_MAX_WAITING = 64
DEFAULT_MAX_BATCH = 4  # answers decoding together, at most (fewer where memory is short)
class Idle:
    """``_next``'s answer when only background calibration is left to do."""


IDLE = Idle()


class NotReadyError(EngineError):
    """The models are still loading, or failed to load."""

    code = "model_not_ready"


class QueueFullError(EngineError):
    """Too many requests are already waiting."""

    code = "queue_full"


class Engine(Protocol):
    """What the worker needs from :class:`engine.spec.session.ChatEngine`."""

    target: Any
    draft: Any
    method: str
    num_draft_tokens: Any

    @property
    def methods(self) -> list[str]: ...

    def check_num_draft_tokens(self, k: Any) -> Any: ...

    def reload_head(self) -> None: ...

    def open_slots(self, count: int) -> int: ...

    def generate(
        self, messages: Any, params: Any = None, *, max_tokens: int = 512,
        stop: Sequence[str] = (), method: str | None = None,
        num_draft_tokens: Any = None, cancel: threading.Event | None = None,
        overflow: str = "stop", continue_final: bool = False, cache: str = "warm",
        slot: int = 0,
    ) -> Iterator[ContextWindow | PromptProgress | TextChunk | Completion]: ...


@dataclass(frozen=True)
class LoadStatus:
    state: str  # "loading", "ready" or "error"
    progress: float
    message: str


@dataclass(frozen=True)
class Started:
    """The request passed the engine's checks and is generating."""

    num_draft_tokens: DraftLength | None


@dataclass(frozen=True)
class Queued:
    """The request waits: ``ahead`` answers (the running one included) come before it."""

    ahead: int


JobEvent = (Queued | Started | ContextWindow | PromptProgress | TextChunk | Completion
            | EngineError)


@dataclass(eq=False)
class Job:
    """One queued request and the channel its events come back on."""

    request: ChatRequest
    decision: Decision
    loop: asyncio.AbstractEventLoop
    events: "asyncio.Queue[JobEvent]" = field(default_factory=asyncio.Queue)
    cancel: threading.Event = field(default_factory=threading.Event)
    ahead: int = 0  # the last position announced with Queued
    slot: int = -1  # the engine's slot while it runs
    lane: Lane | None = None  # its lane of the batch while it runs

    def emit(self, event: JobEvent) -> None:
        """Hand ``event`` to the event loop (from the engine thread)."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the loop has closed: nobody is listening any more
            self.cancel.set()


@dataclass(frozen=True)
class LoadedModelInfo:
    id: str
    role: str
    max_context: int
    memory_bytes: int
    plan: dict[str, Any] | None = None  # its forward plan (engine.cpu.forward.ForwardPlan)


class Scheduler:
    """The FIFO queue, the batch of running answers and the thread that owns the engine."""

    def __init__(
        self,
        loader: Callable[[Progress], Engine],
        settings: SpeculationSettings,
        metrics: Metrics,
        max_waiting: int = DEFAULT_MAX_WAITING,
        calibration_cache: str | None = None,
        max_batch: int = DEFAULT_MAX_BATCH,
    ) -> None:
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"max_batch must be a positive integer, not {max_batch!r}")
        self.max_batch = max_batch  # the engine's slots once loaded (open_slots)
        self.loader = loader
        self.calibration_cache = calibration_cache
        self.report: dict[str, Any] = {}  # the engine's speculation_report(), when it has one
        self.calibrating = False
        self._idle: Iterator[None] | None = None
        self.settings = settings
        self.metrics = metrics
        self.max_waiting = max_waiting
        self.status = LoadStatus("loading", 0.0, "starting")
        self.models: tuple[LoadedModelInfo, ...] = ()
        self._cond = threading.Condition()
        self._queue: deque[Job] = deque()
        self._chores: deque[Callable[[Engine], None]] = deque()
        self._swaps: list[threading.Event] = []  # reload_head's, until their chore ran
        self._running: list[Job] = []
        self._finished_since = False  # an answer left since the last report
        self._stopping = False
        self._thread = threading.Thread(target=self._main, name="anve-engine", daemon=True)
        metrics.bind_queue(lambda: self.waiting, lambda: self.running)

    # --- event-loop side ---------------------------------------------------------

    @property
    def waiting(self) -> int:
        return len(self._queue)

    @property
    def running(self) -> int:
        return len(self._running)

    def load(self) -> int:
        """How many requests would wait if one more arrived now (itself included)."""
        with self._cond:
            busy = len(self._running) >= self.max_batch or bool(self._queue)
            return len(self._queue) + 1 if busy else 0

    def start(self) -> None:
        self._thread.start()

    def require_ready(self) -> None:
        status = self.status
        if status.state == "error":
            raise NotReadyError(f"the models failed to load: {status.message}")
        if status.state != "ready":
            raise NotReadyError(
                f"the models are still loading ({status.progress:.0%}, {status.message}); "
                "poll GET /health until its status is ready"
            )

    def submit(self, job: Job) -> None:
        with self._cond:
            if self._stopping:
                raise NotReadyError("the worker is shutting down")
            if len(self._queue) >= self.max_waiting:
                raise QueueFullError(
                    f"{len(self._queue)} requests are already waiting; try again shortly"
                )
            self._queue.append(job)
            self._announce_positions()
            self._cond.notify()

    def _announce_positions(self) -> None:
        """Tell each waiting job how many answers are ahead of it, when that changed
        (called with the lock held)."""
        # the first jobs take the free slots at the next pass (nothing ahead of them);
        # the others wait behind every running answer and the jobs before them
        running, free = len(self._running), self.max_batch - len(self._running)
        for i, job in enumerate(self._queue):
            ahead = running + i if i >= free else 0
            if job.ahead != ahead:
                job.ahead = ahead
                job.emit(Queued(ahead))

    def reload_head(self) -> threading.Event:
        """Swap in the target's installed draft head before the next answer; the event is
        set once the engine drafts with it and its methods are published."""
        swapped = threading.Event()

        def chore(engine: Engine) -> None:
            try:
                self._swap_head(engine)
            finally:
                with self._cond:
                    self._swaps.remove(swapped)
                swapped.set()

        with self._cond:
            self._swaps.append(swapped)
            self._chores.append(chore)
            self._cond.notify()
        return swapped

    def abandon(self, job: Job) -> None:
        """The client is gone or done: drop the job if waiting, cancel it if running."""
        job.cancel.set()
        with self._cond:
            if job in self._queue:
                self._queue.remove(job)
                self._announce_positions()

    def stop(self, timeout: float = 5.0) -> None:
        with self._cond:
            self._stopping = True
            for job in [*self._queue, *self._running]:
                job.cancel.set()
            self._queue.clear()
            for swapped in self._swaps:  # their chores will not run: nobody waits forever
                swapped.set()
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)

    # --- engine thread -------------------------------------------------------------

    def _main(self) -> None:
        engine = self._load()
        if engine is None:
            return
        while (work := self._next()) is not None:
            if isinstance(work, Idle):
                self._idle_slice(engine)
            elif isinstance(work, Batch):
                self._serve(engine, work)
            else:
                self._chore(engine, work)

    def _serve(self, engine: Engine, batch: Batch) -> None:
        """Run passes until no answer is left: jobs join at each pass while a slot is free
        and no chore waits for the engine."""
        while True:
            with self._cond:
                self._admit(engine, batch)
                if not len(batch):
                    return
            rows = batch.step()
            if rows:
                self.metrics.observe_pass(batch.last_answers)
            with self._cond:
                done = [job for job in self._running if job.lane is None or job.lane.done]
                for job in done:  # the next _admit announces the new places
                    self._leave(job)
                finished, self._finished_since = self._finished_since, False
            if finished:
                self._report(engine)

    def _leave(self, job: Job) -> None:
        """``job`` no longer holds a slot (called with the lock held)."""
        if job in self._running:
            self._running.remove(job)
            self._finished_since = True

    def _admit(self, engine: Engine, batch: Batch) -> None:
        """Start waiting jobs in free slots (called with the lock held)."""
        while self._queue and len(self._running) < self.max_batch and not self._chores \
                and not self._stopping:
            job = self._queue.popleft()
            if job.cancel.is_set():
                continue
            busy = {j.slot for j in self._running}
            job.slot = min(s for s in range(self.max_batch) if s not in busy)
            self._running.append(job)
            job.lane = batch.add(functools.partial(self._run, engine, job),
                                 f"anve-answer-{job.slot}")
        self._announce_positions()

    def _idle_slice(self, engine: Engine) -> None:
        """One slice of the background calibration; report once it is done."""
        assert self._idle is not None
        try:
            next(self._idle)
            return
        except StopIteration:
            log.info("calibration ready")
        except Exception:
            log.exception("calibrating the engine failed; the method choice waits for answers")
        self._idle, self.calibrating = None, False
        self._report(engine)

    def _report(self, engine: Engine) -> None:
        report = getattr(engine, "speculation_report", None)
        if report is not None:
            try:
                self.report = {**report(), "calibrating": self.calibrating}
            except Exception:
                log.exception("the engine's speculation report failed")

    def _chore(self, engine: Engine, chore: Callable[[Engine], None]) -> None:
        try:
            chore(engine)
        except Exception:
            log.exception("an engine chore failed")

    def _swap_head(self, engine: Engine) -> None:
        engine.reload_head()
        self._bind(engine)
        log.info("draft head reloaded; methods: %s", ", ".join(engine.methods))

    def _bind(self, engine: Engine) -> None:
        self.settings.bind(
            engine.methods, engine.method, engine.num_draft_tokens, supports_adaptive(engine)
        )

    def _progress(self, fraction: float, message: str) -> None:
        self.status = LoadStatus("loading", min(max(float(fraction), 0.0), 1.0), message)

    def _load(self) -> Engine | None:
        self._progress(0.0, "loading the engine")
        try:
            engine = self.loader(self._progress)
        except EngineError as exc:
            log.error("loading the models failed: %s", exc)
            self.status = LoadStatus("error", 0.0, str(exc))
            return None
        except Exception as exc:
            log.exception("loading the models failed")
            self.status = LoadStatus("error", 0.0, f"{type(exc).__name__}: {exc}")
            return None
        self.models = describe(engine)
        for model in self.models:
            self.metrics.model_memory.labels(model.role, model.id).set(model.memory_bytes)
        self._bind(engine)
        self.max_batch = engine.open_slots(self.max_batch)
        calibrate = getattr(engine, "calibrate", None)
        if calibrate is not None:
            self._idle, self.calibrating = iter(calibrate(self.calibration_cache)), True
        self._report(engine)
        self.status = LoadStatus("ready", 1.0, "ready")
        log.info("models ready: %s", ", ".join(m.id for m in self.models))
        return engine

    def _next(self) -> "Batch | Callable[[Engine], None] | Idle | None":
        with self._cond:
            while (not self._queue and not self._chores and not self._stopping
                   and self._idle is None):
                self._cond.wait()
            if self._stopping:
                return None
            if self._chores:
                return self._chores.popleft()
            if not self._queue:
                return IDLE
            return Batch()

    def _run(self, engine: Engine, job: Job) -> None:
        """One answer, on its lane of the batch."""
        if job.cancel.is_set():
            return
        decision, request = job.decision, job.request
        k = decision.num_draft_tokens if decision.enabled else None
        try:
            events = engine.generate(
                request.messages, request.params, max_tokens=request.max_tokens,
                stop=request.stop, method=decision.method, num_draft_tokens=k,
                cancel=job.cancel, overflow=request.context_overflow,
                continue_final=request.continue_final, cache=request.cache,
                slot=job.slot,
            )
            job.emit(Started(k))
            for event in events:
                if isinstance(event, Completion):
                    self._finished(event)
                    with self._cond:  # its slot is free before its client hears it is done
                        self._leave(job)
                elif isinstance(event, TextChunk) and event.token_ids:
                    self.metrics.observe_tokens(len(event.token_ids))
                job.emit(event)
        except EngineError as exc:
            job.emit(exc)
        except Exception:
            log.exception("a generation failed")
            job.emit(EngineError("the generation failed inside the engine; see the worker log"))

    def _finished(self, completion: Completion) -> None:
        stats = completion.stats
        self.metrics.observe_completion(stats, completion.finish_reason)
        log.info(
            "answer done: %s, %d+%d tokens, method %s, %d/%d drafts accepted",
            completion.finish_reason, stats.prompt_tokens, stats.completion_tokens,
            stats.method, stats.accepted, stats.drafted,
        )


def supports_adaptive(engine: Engine) -> bool:
    """Whether this engine accepts ``num_draft_tokens="adaptive"``."""
    try:
        engine.check_num_draft_tokens(ADAPTIVE)
    except BadRequestError:
        return False
    return True


def describe(engine: Engine) -> tuple[LoadedModelInfo, ...]:
    """The loaded models as the API lists them."""
    pairs = [("target", engine.target), ("draft", engine.draft)]
    return tuple(
        LoadedModelInfo(m.name, role, int(m.max_context), int(m.memory_bytes),
                        None if m.plan is None else m.plan.to_dict())
        for role, m in pairs
        if m is not None
    )
