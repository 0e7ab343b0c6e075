"""The whole app under a long stream, in a process of its own (``tests/test_app_soak.py``).

``python -m tests.soak_app URL DATA ANSWERS`` opens the app (offscreen) attached to the
fake worker at ``URL``, asks ``ANSWERS`` questions one after another (each in a new
conversation, as staff do) and prints one JSON line: the answers' text lengths, how many
live updates the chat and the speculation panel handled, and the reference counts of
``None``, ``True`` and ``False`` after a first answer and after the last. The client's
throttle is off, so every chunk the fake streams becomes a live update of the chat and of
the speculation panel (whose redraw timer is set to fire at the next idle turn of the
event loop, so it redraws thousands of times instead of four times a second): a Qt
binding that returns ``None`` or a bool without taking a reference (PySide6 6.12.0 on
Python 3.11) loses one reference per call, and the interpreter aborts once one of them
reaches zero. It waits on states (the worker ready, the answer saved), never on times.
"""

import asyncio
import gc
import json
import sys
from collections.abc import Callable
from pathlib import Path

import qasync
from PySide6.QtWidgets import QApplication

from app.application import AnveApp


def singleton_refs() -> dict[str, int]:
    gc.collect()
    return {"None": sys.getrefcount(None), "True": sys.getrefcount(True),
            "False": sys.getrefcount(False)}


async def until(condition: Callable[..., bool]) -> None:
    """Wait for ``condition()`` (checked between event-loop turns)."""
    while not condition():
        await asyncio.sleep(0.005)


async def soak(url: str, data: Path, answers: int) -> dict[str, object]:
    anve = AnveApp(data, worker_url=url)
    anve.client.throttle_s = 0.0
    panel = anve.window.panel
    panel._live_timer.setInterval(0)
    counts = {"progress": 0, "refreshes": 0}

    def progressed(_stats: object) -> None:
        counts["progress"] += 1

    def refreshed() -> None:
        counts["refreshes"] += 1

    anve.chat.answer_progressed.connect(progressed)
    panel._live_timer.timeout.connect(refreshed)
    done: list[int] = []
    anve.chat.answer_completed.connect(lambda message_id, _stats: done.append(message_id))
    anve.start()
    await until(lambda: anve.client.health.ready)
    lengths: list[int] = []
    before: dict[str, int] = {}
    for i in range(answers):
        anve.chat.new_conversation()
        assert anve.chat.send(f"Question {i}: explain speculative decoding at length.")
        await until(lambda n=i: len(done) > n and not anve.chat.busy)
        lengths.append(len(anve.chat.messages.history()[-1]["content"]))
        if i == 0:
            before = singleton_refs()
    after = singleton_refs()
    await anve.shutdown()
    anve.window.close()
    return {"lengths": lengths, "progress": counts["progress"],
            "refreshes": counts["refreshes"], "before": before, "after": after}


def main() -> int:
    url, data, answers = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    qt_app = QApplication.instance() or QApplication(sys.argv[:1])
    assert isinstance(qt_app, QApplication)
    result = qasync.run(soak(url, data, answers))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
