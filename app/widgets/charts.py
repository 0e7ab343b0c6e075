"""Two small charts drawn with QPainter: a trend over the last answers, bars per position.

Contract: :class:`TrendChart` reads a :class:`RecentAnswersModel` (and repaints when it
changes) and draws tokens/s (left scale) and acceptance rate (right scale, 0-100 %)
per answer, plus a hollow point for the answer streaming now (:meth:`set_live`).
:class:`PositionBars` draws, per draft position, the share of target passes whose
draft token at that position was accepted (:meth:`set_rates`).
"""

from PySide6.QtCore import QPointF, QRectF, QSize, Qt
from PySide6.QtGui import QColor, QFont, QPainter, QPainterPath, QPen
from PySide6.QtWidgets import QSizePolicy, QWidget

from app.answer import AnswerStats
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
