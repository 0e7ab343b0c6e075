"""Several answers' target passes in one forward call (continuous batching).

Contract:

* A :class:`Batch` runs each answer as a *lane*: a thread that runs its answer's code
  (:meth:`ChatEngine.generate`: drafting, acceptance, streaming) up to the point where
  its target needs a forward pass, posts that pass's rows and waits. Lanes run one at a
  time, in turn (cooperatively), so the engine's shared state (the office's suffix
  memory, the calibration, the pool of parked caches) needs no locks, and the engine
  is still only ever run by one thread at a time.
* :meth:`Batch.step` resumes every lane that is ready to run (new ones included, so an
  answer joins at the next pass), then runs all the rows they posted in one
  :meth:`~engine.cpu.forward.Forward.step_many` call and hands each lane its logits. A
  lane that finished (or was cancelled) leaves the batch at once.
* Each row of a batched pass is, bit for bit, what its sequence stepped alone would
  give (the forward's row promise across sequences), so under greedy decoding an answer
  in a batch equals the answer served alone.
* A prompt is read at most :data:`PROMPT_ROWS` rows per pass, so the others' decoding
  goes on while it is read and a long prompt stalls them for one short chunk at a time.
* Rows keeping features of different widths (``taps``) run in separate calls.
* A draft tree's rows (``parents``) need their own mask: such a pass runs on its own,
  right after the shared one.
* :func:`batched` wraps a runner's forward pass so that calls from a lane's thread are
  posted to its batch, and calls from any other thread run at once, as before.
* A lane that has to wait for something else (a test's hold) calls :func:`pause`: it
  gives up its turn without rows, so the others' passes go on.
"""

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from engine.cpu import Head

PROMPT_ROWS = 32  # prompt rows one lane adds to a pass (more than a verification's)

_current = threading.local()  # .lane: the Lane this thread runs, if any


@dataclass
class Rows:
    """One lane's share of a pass: ``ids`` appended to ``cache``; the logits of the last
    ``rows`` of them, and the final hidden states with ``keep``."""

    forward: Any  # the engine.cpu Forward to run them on
    ids: list[int]
    cache: Any
    rows: int
    keep: bool
    parents: list[int] | None = None
    taps: tuple[int, ...] = ()  # layers whose residual streams the kept features add
    head: Head | None = None  # in place of the output layer (a drafter's kept ids)
    result: tuple[torch.Tensor, torch.Tensor | None] | None = None
    error: BaseException | None = None


PAUSED = Rows(None, [], None, 0, False)  # what a pausing lane posts: no rows this pass


class Lane:
    """One answer's thread in a :class:`Batch`."""

    def __init__(self, batch: "Batch", work: Callable[[], None], name: str) -> None:
        self.batch = batch
        self.work = work
        self.pending: Rows | None = None
        self.last_rows = 1  # rows it put into the last pass it took part in
        self.done = False
        self._go = threading.Semaphore(0)  # the batch lets this lane run
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        self._go.acquire()
        _current.lane = self
        try:
            self.work()
        finally:
            self.done = True
            self.batch._back.release()

    def _hand_over(self, rows: Rows) -> None:
        self.pending = rows
        self.batch._back.release()
        self._go.acquire()

    def pause(self) -> None:
        """Sit out one pass (see :func:`pause`)."""
        self._hand_over(PAUSED)

    def post(self, rows: Rows) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Hand ``rows`` to the batch and wait for the pass that runs them."""
        self._hand_over(rows)
        if rows.error is not None:
            raise rows.error
        assert rows.result is not None
        return rows.result

    def resume(self) -> None:
        """Let this lane run until it posts its next rows or finishes (batch thread)."""
        self._go.release()
        self.batch._back.acquire()


class Batch:
    """The answers decoding together and the passes that serve them (see the module)."""

    def __init__(self) -> None:
        self.lanes: list[Lane] = []
        self._back = threading.Semaphore(0)  # a lane posted or finished
        self.last_rows = 0  # rows of the last shared pass
        self.last_answers = 0  # answers that took part in it

    def __len__(self) -> int:
        return len(self.lanes)

    def add(self, work: Callable[[], None], name: str = "anve-lane") -> Lane:
        """Start ``work`` (an answer, run on its own thread) at the next pass."""
        lane = Lane(self, work, name)
        self.lanes.append(lane)
        return lane

    def others(self) -> int:
        """Answers that share the coming pass with the one asking (called from a lane)."""
        return max(0, len(self.lanes) - 1)

    def others_rows(self, asking: Lane) -> int:
        """Rows the other answers put into the coming pass: what they posted already this
        round, else what they put into the last one."""
        rows = 0
        for lane in self.lanes:
            if lane is asking or lane.done:
                continue
            posted = lane.pending
            rows += len(posted.ids) if posted is not None and posted is not PAUSED \
                else lane.last_rows
        return rows

    def step(self) -> int:
        """Run every lane up to its next pass, then that pass; returns the rows run."""
        for lane in list(self.lanes):
            if lane.pending is None and not lane.done:
                lane.resume()
        self.lanes = [lane for lane in self.lanes if not lane.done]
        posted = [lane.pending for lane in self.lanes
                  if lane.pending is not None and lane.pending is not PAUSED]
        if posted:
            run(posted)
        for lane in self.lanes:
            if lane.pending is not None and lane.pending is not PAUSED:
                lane.last_rows = len(lane.pending.ids)
            lane.pending = None
        if not posted:
            return 0
        self.last_answers = len(posted)
        self.last_rows = sum(len(r.ids) for r in posted)
        return self.last_rows


def run(posted: Sequence[Rows]) -> None:
    """Compute every posted share: the plain ones of each forward in one call, trees and
    rows with an output layer of their own alone; an error reaches the lanes whose rows it
    concerns."""
    shared: dict[tuple[int, tuple[int, ...]], list[Rows]] = {}
    for rows in posted:
        if rows.parents is None and rows.head is None:
            key = (id(rows.forward), rows.taps if rows.keep else ())
            shared.setdefault(key, []).append(rows)
        else:
            _alone(rows)
    for (_, taps), group in shared.items():
        if len(group) == 1:
            _alone(group[0])
            continue
        fwd = group[0].forward
        try:
            out = fwd.step_many([(r.ids, r.cache) for r in group], [r.rows for r in group],
                                any(r.keep for r in group), taps)
        except Exception as exc:  # each lane raises it in its own answer
            for r in group:
                r.error = exc
            continue
        for r, (logits, hidden) in zip(group, out, strict=True):
            r.result = (logits, hidden if r.keep else None)


def _alone(rows: Rows) -> None:
    try:
        rows.result = rows.forward.step(rows.ids, rows.cache, rows.rows, rows.keep, rows.parents,
                                        rows.taps, head=rows.head)
    except Exception as exc:
        rows.error = exc


def current() -> Lane | None:
    """The lane the calling thread runs, if any."""
    return getattr(_current, "lane", None)


def pause() -> None:
    """Give up the calling lane's turn for one pass (nothing outside a batch)."""
    lane = current()
    if lane is not None:
        lane.pause()


def sharing() -> int:
    """How many other answers share the caller's coming pass (0 outside a batch)."""
    lane = current()
    return 0 if lane is None else lane.batch.others()


def sharing_rows() -> int:
    """How many rows the other answers put into the caller's coming pass (see
    :meth:`Batch.others_rows`; 0 outside a batch)."""
    lane = current()
    return 0 if lane is None else lane.batch.others_rows(lane)


class BatchedForward:
    """A runner's forward pass whose calls from a lane are posted to the lane's batch.

    It offers what :class:`~engine.cpu.ModelRunner` uses of a forward: ``plan``,
    ``dtype``, ``new_cache``, ``step`` and ``read``; a call from outside any lane runs
    on the wrapped forward at once."""

    def __init__(self, forward: Any) -> None:
        self.forward = forward
        self.plan = forward.plan
        self.dtype = forward.dtype

    def new_cache(self) -> Any:
        return self.forward.new_cache()

    def step(self, ids: Sequence[int], cache: Any, rows: int, keep: bool,
             parents: Sequence[int] | None = None, taps: Sequence[int] = (),
             head: Head | None = None,
             ) -> tuple[torch.Tensor, torch.Tensor | None]:
        lane = current()
        if lane is None:
            return self.forward.step(ids, cache, rows, keep, parents, taps, head=head)
        return lane.post(Rows(self.forward, [int(t) for t in ids], cache, rows, keep,
                              None if parents is None else [int(p) for p in parents],
                              tuple(taps), head))

    def read(self, ids: Sequence[int], cache: Any, rows: int, keep: bool,
             taps: Sequence[int] = (),
             head: Head | None = None,
             ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Like the forward's ``read``; in a lane, :data:`PROMPT_ROWS` rows per pass."""
        lane = current()
        if lane is None:
            return self.forward.read(ids, cache, rows, keep, taps, head=head)
        logits, features = [], []
        for start in range(0, len(ids), PROMPT_ROWS):
            chunk = [int(t) for t in ids[start : start + PROMPT_ROWS]]
            after = len(ids) - start - len(chunk)
            wanted = max(0, min(len(chunk), rows - after))
            out, hidden = lane.post(Rows(self.forward, chunk, cache, wanted, keep,
                                         taps=tuple(taps), head=head))
            if wanted:
                logits.append(out)
            if hidden is not None:
                features.append(hidden)
        vocab = logits[0].shape[-1] if logits else 0
        return (torch.cat(logits) if logits else torch.empty(0, vocab),
                torch.cat(features) if keep else None)


def batched(runner: Any) -> None:
    """Route ``runner``'s forward passes through its lane's batch (idempotent)."""
    if not isinstance(runner.model_forward, BatchedForward):
        runner.model_forward = BatchedForward(runner.model_forward)
