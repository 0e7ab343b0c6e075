"""The tests' hold on the worker's answers (``ANVE_TEST_HOLD``), on the fake engine."""

import queue
import threading
from pathlib import Path
from typing import Any

import pytest

from engine.protocol import Completion, TextChunk
from engine.worker.hold import HOLD_ENV, HeldEngine, held_if_asked
from tests.test_worker_app import USER, FakeEngine
from tests.worker_process import Hold

WAIT_S = 60.0  # only a hang takes this long


def fake() -> Any:
    return FakeEngine()  # all of the worker's Engine that these tests use


def consume(events: Any) -> "queue.Queue[Any]":
    """Read ``events`` on a thread of its own, as the worker's engine thread does."""
    received: queue.Queue[Any] = queue.Queue()

    def read() -> None:
        for event in events:
            received.put(event)

    threading.Thread(target=read, daemon=True).start()
    return received


def texts(received: "queue.Queue[Any]", n: int) -> list[str]:
    return [received.get(timeout=WAIT_S).text for _ in range(n)]


def test_answers_send_what_the_file_allows_and_all_once_it_is_gone(tmp_path: Path) -> None:
    hold = Hold(tmp_path / "hold")
    hold.allow(2)
    received = consume(HeldEngine(fake(), hold.path).generate(USER, max_tokens=6))
    assert texts(received, 2) == ["w0 ", "w1 "]
    hold.allow(4)
    assert texts(received, 2) == ["w2 ", "w3 "]
    assert received.empty()  # the fifth waits
    hold.release()
    assert texts(received, 2) == ["w4 ", "w5 "]
    done = received.get(timeout=WAIT_S)
    assert isinstance(done, Completion) and done.text == "w0 w1 w2 w3 w4 w5 "


def test_a_cancelled_answer_stops_waiting(tmp_path: Path) -> None:
    hold, cancel = Hold(tmp_path / "hold"), threading.Event()
    hold.allow(1)
    received = consume(HeldEngine(fake(), hold.path).generate(
        USER, max_tokens=6, cancel=cancel))
    assert texts(received, 1) == ["w0 "]  # the next one waits (or is about to)
    cancel.set()  # as a hang-up does
    events = [received.get(timeout=WAIT_S)]
    while not isinstance(events[-1], Completion):
        events.append(received.get(timeout=WAIT_S))
    assert all(isinstance(e, TextChunk) for e in events[:-1])
    assert events[-1].finish_reason == "cancelled" and events[-1].text in ("w0 ", "w0 w1 ")
    assert hold.path.exists()  # still held: the cancel alone ended the wait


def test_only_the_variable_holds_the_engine(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    engine = fake()

    def load(progress: Any) -> Any:
        return engine

    monkeypatch.delenv(HOLD_ENV, raising=False)
    assert held_if_asked(load) is load
    monkeypatch.setenv(HOLD_ENV, str(tmp_path / "hold"))
    held = held_if_asked(load)(lambda fraction, message: None)
    assert isinstance(held, HeldEngine) and held.engine is engine
    assert (held.methods, held.target.name) == (engine.methods, "fake")  # the engine's own
