"""Python's garbage collector, run on the Qt thread only while the app runs.

Why: Python collects reference cycles in whichever thread happens to allocate when a
threshold is crossed, and the app has threads of its own (the history store's, the
network resolver's). A cycle that holds a Qt object with a running timer, collected on
such a thread, destroys that object there; Qt cannot unregister the timer from another
thread ("QObject::~QObject: Timers cannot be stopped from another thread") and the next
tick of the event loop calls into freed memory: the app crashes.

Contract:

* While at least one :class:`QtThreadCollector` is started, automatic collection is off
  and the collector's timer, on the Qt thread, runs :func:`gc.collect` for the oldest
  generation whose count passed its threshold (as Python itself would), every
  :data:`INTERVAL_MS`.
* :meth:`QtThreadCollector.stop` of the last one collects everything once, on the Qt
  thread, and gives collection back to Python (on only if it was on before the first
  start). Start and stop are idempotent.
"""

import gc

from PySide6.QtCore import QObject, QTimer

INTERVAL_MS = 250  # how often the thresholds are looked at

_started: set["QtThreadCollector"] = set()
_was_enabled = True


def due_generation(counts: tuple[int, int, int], thresholds: tuple[int, int, int]) -> int | None:
    """The oldest generation whose count passed its threshold, or ``None``."""
    due = None
    for generation in range(3):
        if thresholds[generation] and counts[generation] > thresholds[generation]:
            due = generation
    return due


class QtThreadCollector(QObject):
    """Runs Python's collector on the Qt thread (see the module)."""

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._timer = QTimer(self, interval=INTERVAL_MS)
        self._timer.timeout.connect(self.collect_due)

    @property
    def running(self) -> bool:
        return self in _started

    def start(self) -> None:
        global _was_enabled
        if self in _started:
            return
        if not _started:
            _was_enabled = gc.isenabled()
            gc.disable()
        _started.add(self)
        self._timer.start()

    def collect_due(self) -> None:
        """Collect the generation that is due, if any (on the Qt thread)."""
        generation = due_generation(gc.get_count(), gc.get_threshold())
        if generation is not None:
            gc.collect(generation)

    def stop(self) -> None:
        if self not in _started:
            return
        self._timer.stop()
        _started.discard(self)
        if not _started:
            gc.collect()
            if _was_enabled:
                gc.enable()
