"""The load demo page, and the toggle that shows it beside the side-by-side speed demo.

Contract: :class:`LoadDemoPage` has Start and Stop. Start runs
:class:`LoadDemoController` on the shipped demo prompts with the worker's default
speculative method (:func:`app.load_demo.speculative_method` of the setting the client
last received); Stop cancels every answer in flight. While it runs, a line says which
step runs and how many of its answers are done; the chart (:class:`LoadBars`), a
headline (:func:`app.load_demo.headline_text`) and a row per level
(:func:`app.load_demo.table_rows`) fill in as levels are measured, then say which
method ran and whether every answer started cold. A failure is shown in the
error colour; after Stop or a failure the levels measured so far stay shown. The page
only shows what the controller says; :meth:`set_blocked` (the window) says why a run
cannot start now.

:class:`DemoViews` puts the side-by-side page and the load page under one sidebar
entry, with a two-way toggle above them ("Side by side", "Under load").
"""

from typing import Any

from PySide6.QtWidgets import (
    QButtonGroup,
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSpinBox,
    QStackedWidget,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.controllers.load_demo import DEFAULT_MAX_TOKENS, LoadDemoController, Progress
from app.demo import DemoPrompt
from app.load_demo import (
    FAIRNESS,
    LEVELS,
    TABLE_HEADER,
    Measured,
    Report,
    Step,
    asked_name,
    at_once,
    headline_text,
    level_text,
    progress_text,
    ran_text,
    speculative_method,
    start_text,
    table_rows,
)
from app.theme import pad_spin_box
from app.widgets.admin_page import page_heading
from app.widgets.charts import LoadBars
from app.widgets.icons import set_icon

SIDE_BY_SIDE, UNDER_LOAD = "side_by_side", "under_load"


class LoadDemoPage(QWidget):
    def __init__(self, controller: LoadDemoController, prompts: list[DemoPrompt],
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("Page")
        self.controller = controller
        self.prompts = prompts
        self.blocked: str | None = None
        self.setting: dict[str, Any] | None = None
        layout = QVBoxLayout(self)
        layout.setContentsMargins(32, 24, 32, 24)
        layout.setSpacing(14)
        layout.addWidget(page_heading(
            "Speed under load", "1, 2 and then 4 answers at once, decoded together: each "
            "level first with speculation off, then on. Timed by this app: an answer from "
            "its send to its last token, a level's total over its whole wall time."))
        layout.addWidget(self._controls())
        layout.addWidget(self._chart(), 1)
        layout.addWidget(self._results())
        controller.run_started.connect(self._run_started)
        controller.step_started.connect(self._step_started)
        controller.progressed.connect(self._progressed)
        controller.level_measured.connect(self._level_measured)
        controller.run_finished.connect(self._run_finished)
        controller.run_stopped.connect(self._run_stopped)
        controller.run_failed.connect(self._run_failed)
        controller.busy_changed.connect(self._refresh)
        controller.client.speculation_received.connect(self.show_setting)
        self.show_report(Report())
        self._refresh()

    # --- building -------------------------------------------------------------------------

    def _controls(self) -> QWidget:
        """Answer length, the method asked for, why a run cannot start now, Start, Stop;
        then the progress line."""
        frame = QFrame()
        frame.setObjectName("Card")
        self.max_tokens = pad_spin_box(QSpinBox())
        self.max_tokens.setRange(16, 1024)
        self.max_tokens.setValue(DEFAULT_MAX_TOKENS)
        self.max_tokens.setSuffix(" tokens")
        up_to = QLabel("Each answer up to")
        up_to.setObjectName("Muted")
        self.method = QLabel()
        self.method.setObjectName("Muted")
        self.method.setWordWrap(True)
        self.start_button = QPushButton("  Start")
        self.start_button.setObjectName("Primary")
        self.start_button.clicked.connect(self.start)
        self.stop_button = QPushButton("  Stop")
        set_icon(self.stop_button, "stop", "text", 14)
        self.stop_button.clicked.connect(self.stop)
        row = QHBoxLayout()
        row.setSpacing(10)
        row.addWidget(up_to)
        row.addWidget(self.max_tokens)
        row.addWidget(self.method, 1)
        row.addWidget(self.stop_button)
        row.addWidget(self.start_button)
        self.status = QLabel()
        self.status.setObjectName("Verdict")
        self.status.setWordWrap(True)
        layout = QVBoxLayout(frame)
        layout.setContentsMargins(16, 12, 16, 12)
        layout.setSpacing(8)
        layout.addLayout(row)
        layout.addWidget(self.status)
        return frame

    def _chart(self) -> QWidget:
        frame = QFrame()
        frame.setObjectName("Card")
        self.chart = LoadBars()
        layout = QVBoxLayout(frame)
        layout.setContentsMargins(14, 12, 14, 10)
        layout.addWidget(self.chart)
        return frame

    def _results(self) -> QWidget:
        """The headline, a row per level, which method ran, and how the answers started."""
        frame = QFrame()
        frame.setObjectName("Card")
        self.headline = QLabel()
        self.headline.setObjectName("Speed")
        self.headline.setWordWrap(True)
        table = QGridLayout()
        table.setHorizontalSpacing(18)
        table.setVerticalSpacing(3)
        for column, text in enumerate(TABLE_HEADER):
            header = QLabel(text.upper())
            header.setObjectName("Section")
            table.addWidget(header, 0, column)
        self.cells: dict[int, list[QLabel]] = {}
        for row, level in enumerate(LEVELS, start=1):
            self.cells[level] = [QLabel() for _ in TABLE_HEADER]
            for column, cell in enumerate(self.cells[level]):
                table.addWidget(cell, row, column)
        table.setColumnStretch(len(TABLE_HEADER), 1)
        self.ran = QLabel()
        self.ran.setObjectName("Muted")
        self.ran.setWordWrap(True)
        self.start_note = QLabel(FAIRNESS)
        self.start_note.setObjectName("Verdict")
        self.start_note.setWordWrap(True)
        layout = QVBoxLayout(frame)
        layout.setContentsMargins(16, 10, 16, 12)
        layout.setSpacing(6)
        layout.addWidget(self.headline)
        layout.addLayout(table)
        layout.addWidget(self.ran)
        layout.addWidget(self.start_note)
        return frame

    # --- running --------------------------------------------------------------------------

    @property
    def asked_method(self) -> str:
        """The method the speculative steps ask for (the worker's default method)."""
        return speculative_method(self.setting)

    def show_setting(self, setting: dict[str, Any]) -> None:
        self.setting = dict(setting)
        self._refresh()

    def start(self) -> bool:
        """Start a run (False when blocked, running, or there are no prompts)."""
        if self.blocked is not None or self.controller.busy:
            return False
        return self.controller.run(self.prompts, self.asked_method, self.max_tokens.value())

    def stop(self) -> None:
        self.controller.cancel()

    def set_blocked(self, reason: str | None) -> None:
        self.blocked = reason
        self._refresh()

    def _refresh(self, *_: Any) -> None:
        busy = self.controller.busy
        self.start_button.setEnabled(not busy and self.blocked is None and bool(self.prompts))
        self.stop_button.setEnabled(busy)
        self.max_tokens.setEnabled(not busy)
        asks = f"Speculation on: the worker's default method, {asked_name(self.asked_method)}."
        self.method.setText(self.blocked if self.blocked and not busy else asks)

    def _run_started(self) -> None:
        self.show_report(Report())
        self._status("Starting…", "")

    def _step_started(self, step: Step) -> None:
        self.chart.show_report(self.controller.report, step, LEVELS)

    def _progressed(self, progress: Progress) -> None:
        self._status(progress_text(progress.step, progress.done, progress.count), "")

    def _level_measured(self, measured: Measured) -> None:
        self.show_report(self.controller.report)

    def _run_finished(self, report: Report) -> None:
        self.show_report(report)
        levels = ", ".join(str(n) for n in LEVELS[:-1]) + f" and {at_once(LEVELS[-1])}"
        self._status(f"Done: {levels}, each without and with speculation.", "good")

    def _run_stopped(self, report: Report) -> None:
        self.show_report(report)
        self._status("Stopped: every answer in flight was cancelled. The levels measured "
                     "before are shown.", "")

    def _run_failed(self, why: str) -> None:
        self.show_report(self.controller.report)
        self._status(why, "bad")

    # --- results ----------------------------------------------------------------------

    def show_report(self, report: Report) -> None:
        """The chart and the result lines for ``report`` (levels not run say so)."""
        self.chart.show_report(report, self.controller.step if self.controller.busy else None,
                               LEVELS)
        self.headline.setText(headline_text(report) or "No level measured yet.")
        for level, row in zip(LEVELS, table_rows(report, LEVELS), strict=True):
            for cell, text in zip(self.cells[level], row, strict=True):
                cell.setText(text)
                cell.setToolTip(level_text(report, level))
        if report.measured:
            start, fair = start_text(report)
            self._note(self.start_note, start, "" if fair else "bad")
        else:
            self._note(self.start_note, FAIRNESS, "")
        self.ran.setText(ran_text(report, self.asked_method))

    def _status(self, text: str, kind: str) -> None:
        self._note(self.status, text, kind)

    @staticmethod
    def _note(label: QLabel, text: str, kind: str) -> None:
        label.setText(text)
        label.setProperty("kind", kind)
        label.style().polish(label)


class DemoViews(QWidget):
    """The speed demo's sidebar entry: a toggle between the side-by-side page and the
    load page, which keep their state while the other is shown."""

    def __init__(self, side_by_side: QWidget, under_load: QWidget,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("Page")
        self.stack = QStackedWidget()
        self.stack.addWidget(side_by_side)
        self.stack.addWidget(under_load)
        self.buttons: dict[str, QToolButton] = {}
        self.group = QButtonGroup(self)
        self.group.setExclusive(True)
        bar = QHBoxLayout()
        bar.setContentsMargins(32, 14, 32, 0)
        bar.setSpacing(4)
        for key, text in ((SIDE_BY_SIDE, "Side by side"), (UNDER_LOAD, "Under load")):
            button = QToolButton()
            button.setObjectName("Nav")
            button.setText(text)
            button.setCheckable(True)
            button.clicked.connect(lambda _=False, k=key: self.show_view(k))
            self.group.addButton(button)
            self.buttons[key] = button
            bar.addWidget(button)
        bar.addStretch(1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        layout.addLayout(bar)
        layout.addWidget(self.stack, 1)
        self.show_view(SIDE_BY_SIDE)

    @property
    def current(self) -> str:
        return UNDER_LOAD if self.stack.currentIndex() == 1 else SIDE_BY_SIDE

    def show_view(self, key: str) -> None:
        """Show ``"side_by_side"`` or ``"under_load"``."""
        self.stack.setCurrentIndex(1 if key == UNDER_LOAD else 0)
        self.buttons[key].setChecked(True)
