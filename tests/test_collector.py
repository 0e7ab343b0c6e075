"""Python's collector on the Qt thread (app/collector.py): cycles never die on another
thread while it runs, and die on the Qt thread once they are due."""

import gc
import threading

from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app.collector import QtThreadCollector, due_generation


def test_the_oldest_generation_past_its_threshold_is_due() -> None:
    assert due_generation((10, 0, 0), (700, 10, 10)) is None
    assert due_generation((701, 3, 0), (700, 10, 10)) == 0
    assert due_generation((701, 11, 11), (700, 10, 10)) == 2
    assert due_generation((900, 0, 0), (0, 10, 10)) is None  # a zero threshold: never


def test_cycles_die_on_the_qt_thread_only(qapp: QApplication, qtbot: QtBot) -> None:
    died_in: list[str] = []

    class Cycle:
        def __init__(self) -> None:
            self.me = self

        def __del__(self) -> None:
            died_in.append(threading.current_thread().name)

    enabled = gc.isenabled()
    collector = QtThreadCollector()
    collector.start()
    collector.start()  # idempotent
    try:
        assert not gc.isenabled() and collector.running
        gc.collect()
        Cycle()
        # another thread allocates far past every threshold, as the store's thread may
        worker = threading.Thread(target=lambda: [[[] for _ in range(1000)] for _ in range(300)],
                                  name="not-qt")
        worker.start()
        worker.join()
        assert died_in == []
        held = [[] for _ in range(2 * gc.get_threshold()[0])]  # generation 0 is now due
        qtbot.waitUntil(lambda: bool(died_in), timeout=10_000)
        assert died_in == [threading.main_thread().name] and held
    finally:
        collector.stop()
        collector.stop()
    assert gc.isenabled() == enabled and not collector.running
