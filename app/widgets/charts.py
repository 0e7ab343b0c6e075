"""Charts drawn with QPainter: a trend over the last answers, bars per position, the load demo.

Contract: :class:`TrendChart` reads a :class:`RecentAnswersModel` (and repaints when it
changes) and draws tokens/s (left scale) and acceptance rate (right scale, 0-100 %)
per answer, plus a hollow point for the answer streaming now (:meth:`set_live`).
:class:`PositionBars` draws, per draft position, the share of target passes whose
draft token at that position was accepted (:meth:`set_rates`). :class:`LoadBars` draws
the load demo's levels: total tokens/s without and with speculation, each answer's own
speed, the ratio and the slowest first token (:meth:`LoadBars.show_report`).
"""

from PySide6.QtCore import QPointF, QRectF, QSize, Qt
from PySide6.QtGui import QColor, QFont, QPainter, QPainterPath, QPen
from PySide6.QtWidgets import QSizePolicy, QWidget

from app.answer import AnswerStats
from app.load_demo import LEVELS, Measured, Report, Step, at_once, rate_text, seconds_text
from app.models.answers import RecentAnswersModel
from app.theme import colors

PAD_LEFT, PAD_RIGHT, PAD_TOP, PAD_BOTTOM = 34, 34, 10, 18
MIN_SLOTS = 10  # the x axis holds at least this many answers


def nice_ceiling(value: float) -> float:
    """A round axis maximum at or above ``value`` (1, 2, 5 x 10^n)."""
    if value <= 0:
        return 1.0
    step = 10 ** len(str(int(value))) / 10
    for factor in (1, 2, 2.5, 5, 10):
        if factor * step >= value:
            return factor * step
    return 10 * step


def _small_font(widget: QWidget) -> QFont:
    font = QFont(widget.font())
    font.setPixelSize(10)
    return font


class TrendChart(QWidget):
    def __init__(self, model: RecentAnswersModel, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.model = model
        self.live: AnswerStats | None = None
        self.setMinimumHeight(130)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        for signal in (model.modelReset, model.rowsInserted, model.rowsRemoved):
            signal.connect(self.update)

    def sizeHint(self) -> QSize:  # noqa: N802
        return QSize(240, 130)

    def set_live(self, stats: AnswerStats | None) -> None:
        self.live = stats
        self.update()

    def _points(self) -> list[AnswerStats]:
        points = list(self.model.items)
        if self.live is not None and self.live.tokens_per_second:
            points.append(self.live)
        return points[-self.model.capacity :]

    def paintEvent(self, event: object) -> None:  # noqa: N802
        c = colors()
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        painter.setFont(_small_font(self))
        plot = QRectF(PAD_LEFT, PAD_TOP, self.width() - PAD_LEFT - PAD_RIGHT,
                      self.height() - PAD_TOP - PAD_BOTTOM)
        points = self._points()
        top = nice_ceiling(max((p.tokens_per_second or 0 for p in points), default=0) * 1.1)
        self._grid(painter, plot, top, len(points))
        if not points:
            painter.setPen(QColor(c.muted))
            painter.drawText(plot, Qt.AlignmentFlag.AlignCenter, "No answers yet")
            return
        step = plot.width() / (max(len(points), MIN_SLOTS) - 1)
        speed = [(i, p.tokens_per_second) for i, p in enumerate(points)]
        accept = [(i, p.acceptance_rate) for i, p in enumerate(points)]
        self._line(painter, plot, step, speed, top, QColor(c.chart_a))
        self._line(painter, plot, step, accept, 1.0, QColor(c.chart_b))
        painter.end()

    def _grid(self, painter: QPainter, plot: QRectF, top: float, count: int) -> None:
        c = colors()
        painter.setPen(QPen(QColor(c.border), 1))
        for i in range(3):
            y = plot.top() + plot.height() * i / 2
            painter.drawLine(QPointF(plot.left(), y), QPointF(plot.right(), y))
        painter.setPen(QColor(c.chart_a))
        right = Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter
        left = Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter
        for value, y in ((top, plot.top()), (top / 2, plot.center().y()), (0, plot.bottom())):
            painter.drawText(QRectF(0, y - 7, PAD_LEFT - 5, 14), right, f"{value:g}")
        painter.setPen(QColor(c.chart_b))
        for share, y in (("100%", plot.top()), ("50%", plot.center().y()), ("0%", plot.bottom())):
            painter.drawText(QRectF(plot.right() + 5, y - 7, PAD_RIGHT - 5, 14), left, share)
        painter.setPen(QColor(c.muted))
        painter.drawText(QRectF(plot.left(), plot.bottom() + 3, plot.width(), 14),
                         Qt.AlignmentFlag.AlignHCenter,
                         f"last {count} answers" if count != 1 else "last answer")

    def _line(self, painter: QPainter, plot: QRectF, step: float,
              values: list[tuple[int, float | None]], top: float, color: QColor) -> None:
        path = QPainterPath()
        started = False
        dots = []
        for i, value in values:
            if value is None:
                started = False
                continue
            point = QPointF(plot.left() + i * step,
                            plot.bottom() - plot.height() * min(value / top, 1.0))
            if started:
                path.lineTo(point)
            else:
                path.moveTo(point)
            started = True
            dots.append(point)
        painter.setPen(QPen(color, 2))
        painter.setBrush(Qt.BrushStyle.NoBrush)
        painter.drawPath(path)
        painter.setBrush(color)
        for i, dot in enumerate(dots):
            live = self.live is not None and i == len(dots) - 1
            painter.setBrush(QColor(colors().surface) if live else color)
            painter.drawEllipse(dot, 2.5, 2.5)


EMPTY_BARS = "No drafts accepted yet"


class PositionBars(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.rates: list[float] = []
        self.empty_text = EMPTY_BARS
        self.setMinimumHeight(110)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)

    def sizeHint(self) -> QSize:  # noqa: N802
        return QSize(240, 110)

    def set_rates(self, rates: list[float], empty_text: str = "") -> None:
        """Bars per draft position; with none, ``empty_text`` (default: none accepted yet)."""
        empty_text = empty_text or EMPTY_BARS
        if rates != self.rates or empty_text != self.empty_text:
            self.rates, self.empty_text = list(rates), empty_text
            self.update()

    def paintEvent(self, event: object) -> None:  # noqa: N802
        c = colors()
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        painter.setFont(_small_font(self))
        plot = QRectF(8, 14, self.width() - 16, self.height() - 14 - PAD_BOTTOM)
        painter.setPen(QPen(QColor(c.border), 1))
        painter.drawLine(plot.bottomLeft(), plot.bottomRight())
        if not self.rates:
            painter.setPen(QColor(c.muted))
            painter.drawText(plot, Qt.AlignmentFlag.AlignCenter | Qt.TextFlag.TextWordWrap,
                             self.empty_text)
            return
        count = max(len(self.rates), 4)
        slot = plot.width() / count
        width = min(26.0, slot * 0.7)
        for i, rate in enumerate(self.rates):
            x = plot.left() + slot * i + (slot - width) / 2
            height = max(1.0, plot.height() * min(rate, 1.0))
            bar = QRectF(x, plot.bottom() - height, width, height)
            path = QPainterPath()
            path.addRoundedRect(bar, 3, 3)
            painter.fillPath(path, QColor(c.accent))
            painter.setPen(QColor(c.text))
            label = QRectF(x - 10, bar.top() - 13, width + 20, 12)
            painter.drawText(label, Qt.AlignmentFlag.AlignCenter, f"{rate:.0%}")
            painter.setPen(QColor(c.muted))
            painter.drawText(QRectF(x - 6, plot.bottom() + 3, width + 12, 12),
                             Qt.AlignmentFlag.AlignCenter, str(i + 1))
        painter.end()


LOAD_PAD_LEFT, LOAD_PAD_RIGHT, LOAD_PAD_TOP, LOAD_PAD_BOTTOM = 44, 14, 58, 44
LOAD_EMPTY = "Press Start to measure 1, 2 and 4 answers at once"


class LoadBars(QWidget):
    """The load demo's chart: per level (answers at once), two bars of total tokens/s,
    speculation off and on, each answer's own speed as a dot on its bar, the ratio
    above the pair and, under each bar, its slowest first token (:meth:`show_report`).
    Levels not measured yet keep their place; the one being measured says so."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.report = Report()
        self.levels: tuple[int, ...] = LEVELS
        self.measuring: Step | None = None
        self.setMinimumHeight(250)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)

    def sizeHint(self) -> QSize:  # noqa: N802
        return QSize(520, 300)

    def show_report(self, report: Report, measuring: Step | None = None,
                    levels: tuple[int, ...] = LEVELS) -> None:
        """Draw ``report``; ``measuring`` is the step running now (None when none)."""
        self.report, self.measuring, self.levels = report, measuring, levels
        self.update()

    def _top(self) -> float:
        values = [0.0]
        for m in self.report.measured:
            values += [m.total_rate or 0.0, *m.answer_rates]
        return nice_ceiling(max(values) * 1.1)

    def paintEvent(self, event: object) -> None:  # noqa: N802
        c = colors()
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        painter.setFont(_small_font(self))
        self._legend(painter)
        plot = QRectF(LOAD_PAD_LEFT, LOAD_PAD_TOP, self.width() - LOAD_PAD_LEFT - LOAD_PAD_RIGHT,
                      self.height() - LOAD_PAD_TOP - LOAD_PAD_BOTTOM)
        top = self._top()
        self._axis(painter, plot, top)
        slot = plot.width() / max(1, len(self.levels))
        for i, level in enumerate(self.levels):
            self._group(painter, QRectF(plot.left() + slot * i, plot.top(), slot, plot.height()),
                        level, top)
        if not self.report.measured and self.measuring is None:
            painter.setPen(QColor(c.muted))
            painter.drawText(plot.adjusted(0, 0, 0, -plot.height() / 3),
                             Qt.AlignmentFlag.AlignCenter, LOAD_EMPTY)
        painter.end()

    def _legend(self, painter: QPainter) -> None:
        c = colors()
        x = float(LOAD_PAD_LEFT)
        right = Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter
        for colour, text in ((_off_colour(), "Speculation off"), (QColor(c.accent),
                                                                  "Speculation on")):
            swatch = QPainterPath()
            swatch.addRoundedRect(QRectF(x, 6, 11, 11), 2, 2)
            painter.fillPath(swatch, colour)
            painter.setPen(QColor(c.text))
            width = painter.fontMetrics().horizontalAdvance(text)
            painter.drawText(QRectF(x + 16, 2, width + 4, 18), right, text)
            x += 16 + width + 18
        _dot(painter, QPointF(x + 5, 11.5))
        painter.setPen(QColor(c.text))
        text = "each answer's own speed"
        width = painter.fontMetrics().horizontalAdvance(text)
        painter.drawText(QRectF(x + 14, 2, width + 4, 18), right, text)
        painter.setPen(QColor(c.muted))
        note = "under each bar: the slowest first token"
        painter.drawText(QRectF(x + 14 + width + 18, 2, self.width(), 18), right, note)

    def _axis(self, painter: QPainter, plot: QRectF, top: float) -> None:
        c = colors()
        right = Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter
        for i in range(6):
            y = plot.bottom() - plot.height() * i / 5
            painter.setPen(QPen(QColor(c.border), 1))
            painter.drawLine(QPointF(plot.left(), y), QPointF(plot.right(), y))
            painter.setPen(QColor(c.muted))
            painter.drawText(QRectF(0, y - 7, LOAD_PAD_LEFT - 6, 14), right, f"{top * i / 5:g}")
        painter.drawText(QRectF(0, plot.top() - 24, plot.width(), 14),
                         Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter,
                         "tokens/s, all answers")

    def _group(self, painter: QPainter, slot: QRectF, level: int, top: float) -> None:
        """One level: its two bars, their dots and labels, the ratio and the caption."""
        c = colors()
        width = min(64.0, slot.width() * 0.26)
        gap = min(10.0, slot.width() * 0.04)
        centre = slot.center().x()
        tops = []
        for speculative, x in ((False, centre - gap / 2 - width), (True, centre + gap / 2)):
            measured = self.report.get(level, speculative)
            lane = QRectF(x, slot.top(), width, slot.height())
            if measured is not None:
                tops.append(self._bar(painter, lane, measured, top, speculative))
            elif self.measuring == Step(level, speculative):
                painter.setPen(QColor(c.muted))
                painter.drawText(QRectF(x - 20, slot.bottom() - 18, width + 40, 14),
                                 Qt.AlignmentFlag.AlignCenter, "measuring…")
        ratio = self.report.ratio(level)
        if ratio is not None and tops:
            font = QFont(painter.font())
            font.setPixelSize(13)
            font.setWeight(QFont.Weight.Bold)
            painter.save()
            painter.setFont(font)
            painter.setPen(QColor(c.good if ratio >= 1.0 else c.bad))
            painter.drawText(QRectF(slot.left(), min(tops) - 36, slot.width(), 16),
                             Qt.AlignmentFlag.AlignCenter, f"{ratio:.2f}×")
            painter.restore()
        caption = QFont(painter.font())
        caption.setPixelSize(12)
        caption.setWeight(QFont.Weight.DemiBold)
        painter.save()
        painter.setFont(caption)
        painter.setPen(QColor(c.text))
        painter.drawText(QRectF(slot.left(), slot.bottom() + 22, slot.width(), 18),
                         Qt.AlignmentFlag.AlignCenter, at_once(level))
        painter.restore()

    def _bar(self, painter: QPainter, lane: QRectF, measured: Measured, top: float,
             speculative: bool) -> float:
        """Draw one bar with its answers' dots and labels; return the top of its label."""
        c = colors()
        total = measured.total_rate or 0.0
        height = max(2.0, lane.height() * min(total / top, 1.0))
        bar = QRectF(lane.left(), lane.bottom() - height, lane.width(), height)
        path = QPainterPath()
        path.addRoundedRect(bar, 4, 4)
        painter.fillPath(path, QColor(c.accent) if speculative else _off_colour())
        rates = measured.answer_rates
        spread = min(10.0, lane.width() / (len(rates) + 1))
        for i, rate in enumerate(rates):
            x = lane.center().x() + (i - (len(rates) - 1) / 2) * spread
            _dot(painter, QPointF(x, lane.bottom() - lane.height() * min(rate / top, 1.0)))
        painter.setPen(QColor(c.text))
        label = QRectF(lane.left() - 16, bar.top() - 17, lane.width() + 32, 14)
        painter.drawText(label, Qt.AlignmentFlag.AlignCenter, rate_text(measured.total_rate))
        painter.setPen(QColor(c.muted))
        painter.drawText(QRectF(lane.left() - 16, lane.bottom() + 4, lane.width() + 32, 14),
                         Qt.AlignmentFlag.AlignCenter,
                         seconds_text(measured.worst_first_token_s))
        return label.top()


def _off_colour() -> QColor:
    c = colors()
    colour = QColor(c.muted)
    colour.setAlphaF(0.55)
    return colour


def _dot(painter: QPainter, at: QPointF) -> None:
    c = colors()
    painter.save()
    painter.setPen(QPen(QColor(c.text), 1.5))
    painter.setBrush(QColor(c.surface))
    painter.drawEllipse(at, 3.5, 3.5)
    painter.restore()
