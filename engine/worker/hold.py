"""A test-only brake on answers: off unless ``ANVE_TEST_HOLD`` names a file.

Tests of the real worker process need an answer that is still running when they act on
it (hang up, queue more requests, press Stop, kill the worker), however fast the
machine. With ``ANVE_TEST_HOLD=PATH`` in its environment the worker wraps its engine in
:class:`HeldEngine`: while PATH exists and holds an integer N, every answer sends at
most N chunks of text and then waits until the file allows more or is removed, or the
answer is cancelled (it is polled every :data:`POLL_S` meanwhile). Without the variable,
which nothing but the tests sets, the engine is used as it is and nothing is polled.
The tests' side is ``tests.worker_process.Hold``.
"""

import logging
import math
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from engine.protocol import TextChunk

if TYPE_CHECKING:  # the tests import HOLD_ENV without the engine's imports
    from engine.models.registry import Progress
    from engine.worker.scheduler import Engine

log = logging.getLogger(__name__)

HOLD_ENV = "ANVE_TEST_HOLD"
POLL_S = 0.01

Event = TypeVar("Event")


def held_if_asked(
    load: Callable[["Progress"], "Engine"],
) -> Callable[["Progress"], "Engine"]:
    """``load``, or with :data:`HOLD_ENV` set, ``load`` whose engine is held at that file."""
    path = os.environ.get(HOLD_ENV)
    if not path:
        return load
    log.warning("%s is set: answers wait whenever %s says so (a test hook)", HOLD_ENV, path)
    return lambda progress: HeldEngine(load(progress), Path(path))


class HeldEngine:
    """``engine`` whose answers wait at the hold file; everything else is the engine's."""

    def __init__(self, engine: "Engine", path: Path) -> None:
        self.engine, self.path = engine, path

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def generate(self, messages: Any, params: Any = None, *,
                 cancel: threading.Event | None = None,
                 **kwargs: Any) -> Iterator[Any]:
        events = self.engine.generate(messages, params, cancel=cancel, **kwargs)  # checks now
        return self._held(events, cancel or threading.Event())

    def _held(self, events: Iterator[Event], cancel: threading.Event) -> Iterator[Event]:
        from engine.spec.batch import pause  # torch: not when the tests import HOLD_ENV

        sent = 0
        for event in events:
            if isinstance(event, TextChunk) and event.text:  # what the stream sends as a chunk
                while sent >= self.allowed() and not cancel.wait(POLL_S):
                    pause()  # the other answers of the batch go on meanwhile
                sent += 1
            yield event

    def allowed(self) -> float:
        """How many chunks of text an answer may send now (no limit without the file)."""
        try:
            return int(self.path.read_text())
        except FileNotFoundError:
            return math.inf
