"""The live speculation panel on the right; collapsible to a thin strip.

Contract: the panel only shows what it is given: the worker's setting
(:meth:`show_setting`), its health (:meth:`show_health`: "off: high load" when the
worker switched speculation off), the streaming answer's live numbers
(:meth:`show_live`, at most four times a second) and each finished answer
(:meth:`show_final`). The trend chart
reads the :class:`RecentAnswersModel` it is built with. On a foreign engine (vLLM,
llama.cpp, another OpenAI-compatible server) the pill names it and what it says of its
speculation; a figure the server does not report reads "n/a" with "not reported" under
it, never a zero, and a note line names those figures and what the others mean there
(e.g. "shared server: figures include other users' requests").
"""

from typing import Any

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.answer import AnswerStats, method_name
from app.client import Health
from app.engines import (
    ACCEPTANCE,
    ENGINE_NAMES,
    OPENAI,
    PER_POSITION,
    TOKENS_PER_PASS,
    EngineInfo,
)
from app.models.answers import RecentAnswersModel
from app.theme import colors
from app.widgets.charts import PositionBars, TrendChart
from app.widgets.icons import set_icon

WIDTH, COLLAPSED_WIDTH = 300, 48
LIVE_MS = 250
DASH = "–"
NOT_REPORTED = "n/a"


def _fmt(value: float | None, pattern: str) -> str:
    return DASH if value is None else pattern.format(value)


class Stat(QWidget):
    """A big number with a small caption."""

    def __init__(self, caption: str) -> None:
        super().__init__()
        self.value = QLabel(DASH)
        self.value.setObjectName("StatValue")
        self.caption = caption
        self.label = QLabel(caption)
        self.label.setObjectName("StatLabel")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        layout.addWidget(self.value)
        layout.addWidget(self.label)

    def set(self, text: str) -> None:
        self.value.setText(text)
        self.setToolTip("")

    def set_missing(self, why: str) -> None:
        """No figure here (the panel's note line says why): "n/a", never a number."""
        self.value.setText(NOT_REPORTED)
        self.setToolTip(why)


def card(title: str, body: QWidget, caption: str = "") -> QFrame:
    frame = QFrame()
    frame.setObjectName("Card")
    layout = QVBoxLayout(frame)
    layout.setContentsMargins(12, 10, 12, 10)
    layout.setSpacing(6)
    heading = QLabel(title)
    heading.setObjectName("CardTitle")
    layout.addWidget(heading)
    if caption:
        note = QLabel(caption)
        note.setObjectName("Muted")
        note.setWordWrap(True)
        layout.addWidget(note)
    layout.addWidget(body)
    return frame


class SpeculationPanel(QFrame):
    collapsed_changed = Signal(bool)
    """The panel was collapsed (True) or expanded."""

    def __init__(self, answers: RecentAnswersModel, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("Panel")
        self.setting: dict[str, Any] = {}
        self.health = Health("starting")
        self.collapsed = False
        self._pending: AnswerStats | None = None
        self._live_timer = QTimer(self, singleShot=True, interval=LIVE_MS)
        self._live_timer.timeout.connect(self._show_pending)
        self.toggle = QToolButton()
        set_icon(self.toggle, "panel")
        self.toggle.setToolTip("Show or hide the speculation panel")
        self.toggle.clicked.connect(lambda: self.set_collapsed(not self.collapsed))
        self.body = self._body(answers)
        header = QHBoxLayout()
        self.title = QLabel("Speculation")
        self.title.setObjectName("PanelTitle")
        header.addWidget(self.title, 1)
        header.addWidget(self.toggle, 0, Qt.AlignmentFlag.AlignTop)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(14, 14, 10, 14)
        layout.setSpacing(10)
        layout.addLayout(header)
        layout.addWidget(self.body, 1)
        self.setFixedWidth(WIDTH)

    def _body(self, answers: RecentAnswersModel) -> QWidget:
        body = QWidget()
        layout = QVBoxLayout(body)
        layout.setContentsMargins(0, 0, 4, 0)
        layout.setSpacing(12)
        self.pill = QLabel("Connecting…")
        self.pill.setObjectName("Pill")
        self.method = QLabel(DASH)
        self.method.setObjectName("Muted")
        self.method.setWordWrap(True)
        pill_row = QHBoxLayout()
        pill_row.addWidget(self.pill)
        pill_row.addStretch()
        layout.addLayout(pill_row)
        layout.addWidget(self.method)
        layout.addLayout(self._numbers())
        self.notes = QLabel("")
        self.notes.setObjectName("Muted")
        self.notes.setWordWrap(True)
        self.notes.hide()
        layout.addWidget(self.notes)
        self.trend = TrendChart(answers)
        legend = QLabel(f'<span style="color:{colors().chart_a}">●</span> tokens/s &nbsp; '
                        f'<span style="color:{colors().chart_b}">●</span> acceptance')
        legend.setObjectName("Muted")
        self.legend = legend
        trend_box = QWidget()
        trend_layout = QVBoxLayout(trend_box)
        trend_layout.setContentsMargins(0, 0, 0, 0)
        trend_layout.addWidget(legend)
        trend_layout.addWidget(self.trend)
        layout.addWidget(card("Last answers", trend_box))
        self.bars = PositionBars()
        layout.addWidget(card("Acceptance by draft position", self.bars,
                              "Share of passes whose n-th draft token was accepted"))
        layout.addStretch(1)
        self.worker = QLabel(DASH)
        self.worker.setObjectName("Muted")
        self.worker.setWordWrap(True)
        layout.addWidget(self.worker)
        return body

    def _numbers(self) -> QGridLayout:
        grid = QGridLayout()
        grid.setHorizontalSpacing(14)
        grid.setVerticalSpacing(10)
        self.speed, self.acceptance = Stat("tokens/s now"), Stat("acceptance rate")
        self.mean_length, self.first_token = Stat("tokens per pass"), Stat("first token")
        for i, stat in enumerate((self.speed, self.acceptance, self.mean_length,
                                  self.first_token)):
            grid.addWidget(stat, i // 2, i % 2)
        return grid

    # --- showing ---------------------------------------------------------------------------

    def show_setting(self, setting: dict[str, Any]) -> None:
        self.setting = dict(setting)
        self._show_state()

    def show_health(self, health: Health) -> None:
        self.health = health
        self._show_state()
        where = health.url or "no address yet"
        engine = health.engine
        if engine is not None and engine.foreign:
            self.worker.setText(f"Server: {where} · {engine.name} · {health.state}")
        else:
            self.worker.setText(f"Worker: {where} · {health.state}")

    def _show_state(self) -> None:
        engine = self.health.engine
        if engine is not None and engine.foreign:
            self._show_foreign_state()
            return
        enabled = bool(self.setting.get("enabled", False))
        if not self.setting:
            text, kind = "Waiting for the worker", "off"
        elif enabled and self.health.load_off:
            text, kind = "Off: high load", "load"
        elif enabled:
            text, kind = "Speculation on", "on"
        else:
            text, kind = "Speculation off", "off"
        self.pill.setText(text)
        self.pill.setProperty("kind", kind)
        self.pill.style().polish(self.pill)
        k = self.setting.get("num_draft_tokens")
        drafts = "adaptive draft length" if k == "adaptive" else f"{k} draft tokens"
        method = self.setting.get("method")
        self.method.setText(f"Method: {method_name(method)} · {drafts}" if method else DASH)

    def _show_foreign_state(self) -> None:
        engine = self.health.engine
        assert engine is not None
        kind = "on" if engine.speculative else "off"
        text = ENGINE_NAMES.get(engine.kind, engine.kind)
        if engine.speculative is True:
            text = f"{text} · speculation on"
        elif engine.speculative is False:
            text = f"{text} · speculation off"
        self.pill.setText(text)
        self.pill.setProperty("kind", kind)
        self.pill.style().polish(self.pill)
        where = "" if engine.kind == OPENAI else " (set on the server)"
        self.method.setText(f"Speculation: {engine.speculation}{where}")

    def show_live(self, stats: AnswerStats) -> None:
        """Numbers of the answer streaming now (the app's own count), shown at most every
        :data:`LIVE_MS`: readable, and cheap while text streams into the chat."""
        self._pending = stats
        if not self._live_timer.isActive():
            self._live_timer.start()

    def _show_pending(self) -> None:
        if self._pending is not None:
            self._show_numbers(self._pending)
            self.trend.set_live(self._pending)
            self._pending = None

    def show_final(self, stats: AnswerStats) -> None:
        """The worker's measured numbers of a finished answer."""
        self._pending = None
        self._live_timer.stop()
        self._show_numbers(stats)
        self.acceptance.set(_fmt(stats.acceptance_rate, "{:.0%}"))
        self._show_unreported(stats)
        self.trend.set_live(None)

    def _show_unreported(self, stats: AnswerStats) -> None:
        """Say which figures the server does not report (or, for a server that reports
        them, which are missing for this answer), and what the others mean there."""
        engine = ENGINE_NAMES.get(stats.engine, stats.engine)
        reported = EngineInfo(stats.engine).reported if stats.engine in ENGINE_NAMES else ()
        never = [f for f in stats.unreported if f not in reported]
        missing = [f for f in stats.unreported if f in reported]
        for figure, stat in ((ACCEPTANCE, self.acceptance),
                             (TOKENS_PER_PASS, self.mean_length)):
            if figure in never:
                stat.set_missing(f"{engine} does not report the {figure}")
            elif figure in missing:
                stat.set_missing("; ".join(stats.notes))
        lines = []
        if never:
            lines.append(f"Not reported by {engine}: {', '.join(never)}.")
        if missing:
            lines.append(f"No {', '.join(missing)} for this answer.")
        lines += [f"• {note}" for note in stats.notes]
        if PER_POSITION in stats.unreported:
            self.bars.set_rates([], "not reported by this server" if PER_POSITION in never
                                else "none for this answer")
        self.notes.setText("\n".join(lines))
        self.notes.setVisible(bool(lines))

    def _show_numbers(self, stats: AnswerStats) -> None:
        self.speed.set(_fmt(stats.tokens_per_second, "{:.1f}"))
        self.mean_length.set(_fmt(stats.mean_accepted_length, "{:.2f}"))
        self.first_token.set(_fmt(stats.time_to_first_token_s, "{:.2f} s"))
        if stats.acceptance_rate is not None:
            self.acceptance.set(f"{stats.acceptance_rate:.0%}")
        self.bars.set_rates(stats.position_rates)

    def begin_answer(self) -> None:
        self.acceptance.set("…")
        self.bars.set_rates([])
        self.notes.hide()

    def set_collapsed(self, collapsed: bool) -> None:
        self.collapsed = collapsed
        self.body.setVisible(not collapsed)
        self.title.setVisible(not collapsed)
        self.setFixedWidth(COLLAPSED_WIDTH if collapsed else WIDTH)
        self.collapsed_changed.emit(collapsed)

    def refresh_theme(self) -> None:
        c = colors()
        self.legend.setText(f'<span style="color:{c.chart_a}">●</span> tokens/s &nbsp; '
                            f'<span style="color:{c.chart_b}">●</span> acceptance')
        self.update()
