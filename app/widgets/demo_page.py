"""The side-by-side speed demo page.

Contract: pick a shipped prompt (or type one) and a method, press Run: the
:class:`DemoController` runs it plain and then speculative, both cold, and each pane
fills live. Afterwards the page shows the speedup end to end (the headline) and after
the first token, each side's time to first token, which method ran (the worker's
``speculation.method``), whether both runs started from the same cache state, both
speeds, acceptance, whether the outputs are identical (or where they first differ),
and can replay both answers side by side at their measured timings. Saved runs are
listed below and can be shown again.
"""

import time
from typing import Any

from PySide6.QtCore import QModelIndex, QTimer
from PySide6.QtWidgets import (
    QComboBox,
    QFrame,
    QHBoxLayout,
    QLabel,
    QListView,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.answer import AnswerStats, footer_text, method_name
from app.client import AnswerProgress, AnswerResult
from app.controllers.demo import PLAIN, SPECULATIVE, DemoController
from app.demo import (
    DemoPrompt,
    compare,
    duration,
    method_text,
    side_stats,
    speed_text,
    speedups,
    start_text,
    text_at,
)
from app.models.demo_runs import Roles
from app.store import DemoRun
from app.theme import pad_spin_box
from app.widgets.admin_page import page_heading
from app.widgets.icons import set_icon
from app.widgets.message_view import monospace_font

REPLAY_TICK_MS = 30
OWN_PROMPT = "Your own prompt"


class DemoPane(QFrame):
    """One side: a title, its live speed, the answer text and its numbers."""

    def __init__(self, title: str) -> None:
        super().__init__()
        self.setObjectName("Pane")
        self.title = QLabel(title)
        self.title.setObjectName("PaneTitle")
        self.status = QLabel("waiting")
        self.status.setObjectName("Muted")
        self.text = QPlainTextEdit()
        self.text.setObjectName("PaneText")
        self.text.setReadOnly(True)
        self.text.setFont(monospace_font())  # answers are compared character for character
        self.footer = QLabel("")
        self.footer.setObjectName("Footer")
        self.footer.setWordWrap(True)
        header = QHBoxLayout()
        header.addWidget(self.title, 1)
        header.addWidget(self.status)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(14, 12, 14, 12)
        layout.setSpacing(8)
        layout.addLayout(header)
        layout.addWidget(self.text, 1)
        layout.addWidget(self.footer)

    def clear(self, status: str = "waiting") -> None:
        self.text.clear()
        self.footer.clear()
        self.status.setText(status)

    def show_text(self, text: str) -> None:
        if self.text.toPlainText() != text:
            self.text.setPlainText(text)
            bar = self.text.verticalScrollBar()
            bar.setValue(bar.maximum())

    def show_stats(self, stats: AnswerStats, final: bool) -> None:
        speed = stats.tokens_per_second
        self.status.setText("…" if speed is None else f"{speed:.1f} tok/s")
        if final:
            self.footer.setText(footer_text(stats))


class DemoPage(QWidget):
    def __init__(self, controller: DemoController, prompts: list[DemoPrompt],
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("Page")
        self.controller = controller
        self.prompts = prompts
        self.blocked: str | None = None
        self.shown: DemoRun | None = None
        self._replay_started = 0.0
        self._replay = QTimer(self, interval=REPLAY_TICK_MS)
        self._replay.timeout.connect(self._replay_tick)
        self.panes = {PLAIN: DemoPane("Plain decoding (speculation off)"),
                      SPECULATIVE: DemoPane("Speculative decoding")}
        layout = QVBoxLayout(self)
        layout.setContentsMargins(32, 24, 32, 24)
        layout.setSpacing(14)
        layout.addWidget(page_heading(
            "Speed demo", "The same prompt answered twice on this machine, one after the other: "
            "plain, then with speculative decoding, both from a cold start. Greedy, so the "
            "answers must be identical."))
        layout.addWidget(self._controls())
        panes = QHBoxLayout()
        panes.setSpacing(14)
        panes.addWidget(self.panes[PLAIN])
        panes.addWidget(self.panes[SPECULATIVE])
        layout.addLayout(panes, 1)
        layout.addWidget(self._results())
        layout.addWidget(self._runs())
        controller.pane_updated.connect(self._pane_updated)
        controller.pane_finished.connect(self._pane_finished)
        controller.run_started.connect(self._run_started)
        controller.run_finished.connect(self.show_run)
        controller.run_failed.connect(self._run_failed)
        controller.busy_changed.connect(self._refresh)
        self.prompt.textChanged.connect(self._refresh)
        controller.client.speculation_received.connect(self.show_methods)
        self._refresh()

    # --- building -------------------------------------------------------------------------

    def _controls(self) -> QWidget:
        frame = QFrame()
        frame.setObjectName("Card")
        layout = QVBoxLayout(frame)
        layout.setContentsMargins(16, 12, 16, 12)
        layout.setSpacing(8)
        self.prompt = QPlainTextEdit()
        self.prompt.setFixedHeight(74)
        self.prompt.setPlaceholderText("Type a prompt")
        layout.addLayout(self._choices())
        layout.addWidget(self.prompt)
        layout.addLayout(self._run_row())
        self._prompt_chosen(0)
        return frame

    def _choices(self) -> QHBoxLayout:
        """Prompt (shipped ones, or your own) and method."""
        self.prompt_choice, self.method = QComboBox(), QComboBox()
        for prompt in self.prompts:
            self.prompt_choice.addItem(prompt.title, prompt.prompt)
        self.prompt_choice.addItem(OWN_PROMPT, "")
        self.prompt_choice.currentIndexChanged.connect(self._prompt_chosen)
        self.method.addItem(method_name("draft").capitalize(), "draft")
        row = QHBoxLayout()
        row.setSpacing(10)
        for caption, combo, length, stretch in (("Prompt", self.prompt_choice, 14, 3),
                                                ("Method", self.method, 8, 1)):
            combo.setSizeAdjustPolicy(
                QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
            combo.setMinimumContentsLength(length)
            label = QLabel(caption)
            label.setObjectName("Muted")
            row.addWidget(label)
            row.addWidget(combo, stretch)
        return row

    def _run_row(self) -> QHBoxLayout:
        """Answer length, why a run cannot start now, and Run."""
        self.max_tokens = pad_spin_box(QSpinBox())
        self.max_tokens.setRange(16, 2048)
        self.max_tokens.setValue(256)
        self.max_tokens.setSuffix(" tokens")
        self.run_button = QPushButton("  Run demo")
        self.run_button.setObjectName("Primary")
        self.run_button.clicked.connect(self._run_clicked)
        self.reason = QLabel()
        self.reason.setObjectName("Muted")
        self.reason.setWordWrap(True)
        up_to = QLabel("Answer up to")
        up_to.setObjectName("Muted")
        row = QHBoxLayout()
        row.setSpacing(10)
        row.addWidget(up_to)
        row.addWidget(self.max_tokens)
        row.addWidget(self.reason, 1)
        row.addWidget(self.run_button)
        return row

    def _results(self) -> QWidget:
        """The speedup end to end, the verdict, the details line and how both runs started."""
        bar = QFrame()
        bar.setObjectName("Card")
        self.speedup = QLabel("–")
        self.speedup.setObjectName("Speed")
        self.speedup_note = QLabel("")
        self.speedup_note.setObjectName("Muted")
        self.verdict = QLabel("Run the demo to compare both answers.")
        self.verdict.setObjectName("Verdict")
        self.verdict.setWordWrap(True)
        self.details = QLabel("")
        self.details.setObjectName("Muted")
        self.details.setWordWrap(True)
        self.start_note = QLabel("")
        self.start_note.setObjectName("Verdict")
        self.start_note.setWordWrap(True)
        self.replay_button = QPushButton("  Replay side by side")
        set_icon(self.replay_button, "play", "text", 14)
        self.replay_button.clicked.connect(self.replay)
        self.replay_note = QLabel("Replay of measured timings")
        self.replay_note.setObjectName("Muted")
        columns = QHBoxLayout()
        columns.setSpacing(16)
        for widgets, stretch in (((self.speedup, self.speedup_note), 0),
                                 ((self.verdict, self.details), 1),
                                 ((self.replay_button, self.replay_note), 0)):
            column = QVBoxLayout()
            column.setSpacing(2)
            for widget in widgets:
                column.addWidget(widget)
            column.addStretch(1)
            columns.addLayout(column, stretch)
        layout = QVBoxLayout(bar)
        layout.setContentsMargins(16, 10, 16, 10)
        layout.setSpacing(6)
        layout.addLayout(columns)
        layout.addWidget(self.start_note)
        return bar

    def _runs(self) -> QWidget:
        box = QWidget()
        layout = QVBoxLayout(box)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(6)
        title = QLabel("SAVED RUNS")
        title.setObjectName("Section")
        self.runs = QListView()
        self.runs.setObjectName("Runs")
        self.runs.setModel(self.controller.runs)
        self.runs.setFixedHeight(96)
        self.runs.clicked.connect(self._run_clicked_in_list)
        layout.addWidget(title)
        layout.addWidget(self.runs)
        return box

    # --- running --------------------------------------------------------------------------

    def _prompt_chosen(self, index: int) -> None:
        text = self.prompt_choice.itemData(index) or ""
        if self.prompt_choice.itemText(index) != OWN_PROMPT or not self.prompt.toPlainText():
            self.prompt.setPlainText(text)

    def show_methods(self, setting: dict[str, Any]) -> None:
        current = self.method.currentData()
        methods = [m for m in setting.get("available_methods") or () if m != "off"]
        self.method.clear()
        for method in methods:
            self.method.addItem(method_name(method).capitalize(), method)
        wanted = current if current in methods else setting.get("method")
        self.method.setCurrentIndex(max(0, self.method.findData(wanted)))

    def start(self, prompt: str | None = None, method: str | None = None) -> bool:
        """Run the demo (tests pass the prompt and method directly)."""
        if prompt is not None:
            self.prompt.setPlainText(prompt)
        if method is not None:
            self.method.setCurrentIndex(max(0, self.method.findData(method)))
        if self.blocked is not None:
            return False
        return self.controller.run(self.prompt.toPlainText(), self.method.currentData() or "draft",
                                   self.max_tokens.value())

    def _run_clicked(self) -> None:
        if self.controller.busy:
            self.controller.cancel()
        else:
            self.start()

    def _run_started(self, prompt: str, method: str) -> None:
        self._replay.stop()
        self.shown = None
        self.panes[PLAIN].clear("running…")
        self.panes[SPECULATIVE].clear("waiting for the plain run")
        self.panes[SPECULATIVE].title.setText(f"Speculative: {method_name(method)}")
        self.speedup.setText("–")
        self._verdict("Running plain first, then speculative, both from a cold start…", "")
        self.details.clear()
        self._note(self.start_note, "", "")

    def _pane_updated(self, side: str, progress: AnswerProgress) -> None:
        self.panes[side].show_text(progress.text)
        self.panes[side].show_stats(progress.stats, final=False)

    def _pane_finished(self, side: str, result: AnswerResult) -> None:
        pane = self.panes[side]
        pane.show_text(result.text)
        pane.show_stats(result.stats, final=True)
        if side == PLAIN:
            self.panes[SPECULATIVE].status.setText("running…")

    def _run_failed(self, why: str) -> None:
        self._verdict(why, "bad")

    def set_blocked(self, reason: str | None) -> None:
        self.blocked = reason
        self._refresh()

    def _refresh(self, *_: Any) -> None:
        busy = self.controller.busy
        self.run_button.setText("  Stop" if busy else "  Run demo")
        self.run_button.setEnabled(busy or (self.blocked is None
                                            and bool(self.prompt.toPlainText().strip())))
        self.reason.setText(self.blocked or "")
        self.replay_button.setEnabled(not busy and self.shown is not None)

    # --- results and replay -------------------------------------------------------------------

    def show_run(self, run: DemoRun) -> None:
        self._replay.stop()
        self.shown = run
        (plain, plain_time), (fast, fast_time) = side_stats(run.plain), side_stats(run.speculative)
        for side, data, stats in ((PLAIN, run.plain, plain), (SPECULATIVE, run.speculative, fast)):
            self.panes[side].show_text(str(data.get("text", "")))
            self.panes[side].show_stats(stats, final=True)
        ran = fast.method if fast.enabled else run.method
        self.panes[SPECULATIVE].title.setText(f"Speculative: {method_name(ran)}")
        total = speedups(plain_time, fast_time).total
        self.speedup.setText(f"{total:.2f}× faster" if total else "–")
        self.speedup_note.setText("end to end" if total else "")
        self.details.setText(f"{speed_text(plain_time, fast_time)} · "
                             f"{method_text(fast, run.method)}")
        start, fair = start_text(plain, fast)
        self._note(self.start_note, start, "" if fair else "bad")
        same = compare(str(run.plain.get("text", "")), str(run.speculative.get("text", "")))
        if run.identical:
            self._verdict("✓ Identical output, token for token", "good")
        else:
            self._verdict(same.describe() if not same.identical else
                          "Outputs differ in length (token count).", "bad")
        self._refresh()

    def _verdict(self, text: str, kind: str) -> None:
        self._note(self.verdict, text, kind)

    @staticmethod
    def _note(label: QLabel, text: str, kind: str) -> None:
        label.setText(text)
        label.setProperty("kind", kind)
        label.style().polish(label)

    def _run_clicked_in_list(self, index: QModelIndex) -> None:
        run = index.data(Roles.RUN)
        if isinstance(run, DemoRun) and not self.controller.busy:
            self.show_run(run)

    def replay(self) -> None:
        if self.shown is None:
            return
        for pane in self.panes.values():
            pane.text.clear()
        self._replay_started = time.monotonic()
        self._replay.start()

    def _replay_tick(self) -> None:
        run = self.shown
        if run is None:
            self._replay.stop()
            return
        t = time.monotonic() - self._replay_started
        end = 0.0
        for side, data in ((PLAIN, run.plain), (SPECULATIVE, run.speculative)):
            timeline = data.get("timeline") or []
            end = max(end, duration(timeline))
            self.panes[side].show_text(text_at(timeline, t))
            self.panes[side].status.setText(f"replay {min(t, duration(timeline)):.2f} s")
        if t > end:
            self._replay.stop()
            self.show_run(run)

    @property
    def replaying(self) -> bool:
        return self._replay.isActive()
