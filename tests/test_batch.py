"""The lanes of a batch on a fake forward: who runs when, and what one pass carries."""

import threading
from collections.abc import Sequence
from typing import Any

import pytest
import torch

from engine.spec.batch import (
    PROMPT_ROWS,
    Batch,
    BatchedForward,
    current,
    pause,
    sharing,
    sharing_rows,
)

VOCAB = 7


class FakeForward:
    """Records its calls; a row's logit is its id plus its position in the cache."""

    plan = None
    dtype = torch.float32

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[list[int]]]] = []
        self.fail = False

    def new_cache(self) -> list[int]:
        return []

    def _logits(self, ids: Sequence[int], cache: list[int], rows: int) -> torch.Tensor:
        start = len(cache)
        cache.extend(ids)
        out = torch.zeros(rows, VOCAB)
        for r in range(rows):
            i = len(ids) - rows + r
            out[r, 0] = ids[i] + start + i
        return out

    def step(self, ids: Sequence[int], cache: list[int], rows: int, keep: bool,
             parents: Sequence[int] | None = None, taps: Sequence[int] = (),
             head: Any = None) -> tuple[torch.Tensor, None]:
        if self.fail:
            raise RuntimeError("the forward broke")
        self.calls.append(("tree" if parents else "head" if head else "step", [list(ids)]))
        logits = self._logits(ids, cache, rows)
        return (logits if head is None else head(logits)), None

    def read(self, ids: Sequence[int], cache: list[int], rows: int, keep: bool,
             taps: Sequence[int] = (), head: Any = None) -> tuple[torch.Tensor, None]:
        self.calls.append(("read", [list(ids)]))
        logits = self._logits(ids, cache, rows)
        return (logits if head is None else head(logits)), None

    def step_many(self, steps: Sequence[tuple[Sequence[int], list[int]]],
                  rows: Sequence[int], keep: bool = False, taps: Sequence[int] = ()
                  ) -> list[tuple[torch.Tensor, None]]:
        if self.fail:
            raise RuntimeError("the forward broke")
        self.calls.append(("many", [list(ids) for ids, _ in steps]))
        return [(self._logits(ids, cache, r), None)
                for (ids, cache), r in zip(steps, rows, strict=True)]


def drain(batch: Batch) -> int:
    passes = 0
    while len(batch):
        passes += bool(batch.step())
    return passes


def test_every_lanes_rows_go_in_one_call_and_each_gets_its_own_logits() -> None:
    fake = FakeForward()
    fwd = BatchedForward(fake)
    got: dict[int, list[float]] = {}

    def answer(i: int) -> None:
        cache: list[int] = []
        seen = []
        for token in range(3):
            logits, _ = fwd.step([10 * i + token], cache, 1, False)
            seen.append(float(logits[0, 0]))
        got[i] = seen

    batch = Batch()
    for i in range(3):
        batch.add(lambda i=i: answer(i))
    assert drain(batch) == 3
    assert [kind for kind, _ in fake.calls] == ["many"] * 3
    assert fake.calls[0][1] == [[0], [10], [20]]
    for i in range(3):  # what each would have got alone
        assert got[i] == [10 * i + t + t for t in range(3)]


def test_a_lane_that_joins_later_shares_the_next_pass() -> None:
    fake = FakeForward()
    fwd = BatchedForward(fake)
    batch = Batch()

    def answer(first: int, steps: int) -> None:
        cache: list[int] = []
        for t in range(steps):
            fwd.step([first + t], cache, 1, False)

    batch.add(lambda: answer(100, 4))
    batch.step()
    batch.step()
    batch.add(lambda: answer(200, 2))
    drain(batch)
    assert [ids for _, ids in fake.calls] == [[[100]], [[101]], [[102], [200]], [[103], [201]]]


def test_a_prompt_is_read_in_short_chunks_between_the_others_rows() -> None:
    fake = FakeForward()
    fwd = BatchedForward(fake)
    batch = Batch()
    prompt = list(range(PROMPT_ROWS * 2 + 5))
    read: list[torch.Tensor] = []

    def reader() -> None:
        logits, _ = fwd.read(prompt, [], 2, False)
        read.append(logits)

    def decoder() -> None:
        cache: list[int] = []
        for t in range(5):
            fwd.step([t], cache, 1, False)

    batch.add(decoder)
    batch.add(reader)
    drain(batch)
    sizes = [[len(ids) for ids in group] for _, group in fake.calls]
    assert sizes[:3] == [[1, PROMPT_ROWS], [1, PROMPT_ROWS], [1, 5]]
    alone = FakeForward()._logits(prompt, [], 2)
    assert torch.equal(read[0], alone)  # the split does not change what comes out


def test_outside_a_lane_the_forward_runs_at_once() -> None:
    fake = FakeForward()
    fwd = BatchedForward(fake)
    assert current() is None and sharing() == 0
    pause()  # nothing to give up
    fwd.step([1, 2], [], 1, False)
    fwd.read([1, 2, 3], [], 1, False)
    assert [kind for kind, _ in fake.calls] == ["step", "read"]


def test_trees_run_alone_and_a_lone_lane_steps_plainly() -> None:
    fake = FakeForward()
    fwd = BatchedForward(fake)
    batch = Batch()
    batch.add(lambda: fwd.step([1, 2, 3], [], 3, False, parents=[-1, 0, 0]))
    batch.add(lambda: fwd.step([9], [], 1, False))
    drain(batch)
    assert sorted(kind for kind, _ in fake.calls) == ["step", "tree"]


def test_an_error_in_a_pass_reaches_every_lane_in_it() -> None:
    fake = FakeForward()
    fake.fail = True
    fwd = BatchedForward(fake)
    errors: list[str] = []

    def answer() -> None:
        try:
            fwd.step([1], [], 1, False)
        except RuntimeError as exc:
            errors.append(str(exc))

    batch = Batch()
    batch.add(answer)
    batch.add(answer)
    drain(batch)
    assert errors == ["the forward broke"] * 2


def test_a_pausing_lane_lets_the_others_pass_and_lanes_know_their_company() -> None:
    fake = FakeForward()
    fwd = BatchedForward(fake)
    gate = threading.Event()
    company: list[int] = []

    def waiting() -> None:
        while not gate.is_set():
            pause()
        fwd.step([50], [], 1, False)

    def working() -> None:
        cache: list[int] = []
        for t in range(3):
            company.append(sharing())
            fwd.step([t], cache, 1, False)
        gate.set()

    batch = Batch()
    batch.add(waiting)
    batch.add(working)
    drain(batch)
    assert [ids for _, ids in fake.calls][:3] == [[[0]], [[1]], [[2]]]
    assert company == [1, 1, 1]


@pytest.mark.parametrize("rows", [0, 1])
def test_lanes_run_one_at_a_time(rows: int) -> None:
    """No two lanes' Python ever runs at once: the engine needs no locks."""
    fake = FakeForward()
    fwd = BatchedForward(fake)
    inside = []
    lock = threading.Lock()
    overlaps = []

    def answer(i: int) -> None:
        cache: list[Any] = []
        for t in range(5):
            with lock:
                inside.append(i)
                if len(inside) > 1:
                    overlaps.append(list(inside))
            sum(range(20_000))  # some work while "inside"
            with lock:
                inside.remove(i)
            fwd.step([t, t][: rows + 1], cache, rows + 1, False)

    batch = Batch()
    for i in range(4):
        batch.add(lambda i=i: answer(i))
    drain(batch)
    assert not overlaps


def test_a_lane_counts_the_rows_the_others_put_into_its_pass() -> None:
    fake = FakeForward()
    fwd = BatchedForward(fake)
    seen: list[int] = []

    def wide() -> None:  # a verification of 5 rows each pass
        cache: list[int] = []
        for t in range(3):
            fwd.step([t] * 5, cache, 5, False)

    def narrow() -> None:
        cache: list[int] = []
        for t in range(3):
            seen.append(sharing_rows())
            fwd.step([t], cache, 1, False)

    batch = Batch()
    batch.add(wide)
    batch.add(narrow)
    drain(batch)
    assert seen == [5, 5, 5]  # wide posted its 5 rows before narrow chose its own


def test_rows_with_an_output_layer_of_their_own_run_alone_with_it() -> None:
    """A drafter's short output layer (kept ids only) never mixes with the shared call's."""
    fake = FakeForward()
    fwd = BatchedForward(fake)
    batch = Batch()
    got: list[torch.Tensor] = []

    def kept(logits: torch.Tensor) -> torch.Tensor:
        return logits[:, :2] * 10  # [rows, 2]

    batch.add(lambda: got.append(fwd.step([4], [], 1, False, head=kept)[0]))
    batch.add(lambda: fwd.step([9], [], 1, False))
    batch.add(lambda: fwd.step([8], [], 1, False))
    drain(batch)
    assert sorted(kind for kind, _ in fake.calls) == ["head", "many"]
    assert torch.equal(got[0], torch.tensor([[40.0, 0.0]]))
    assert torch.equal(fwd.read([1, 2, 3], [], 1, False, head=kept)[0], torch.tensor([[50.0, 0.0]]))
