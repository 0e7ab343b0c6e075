"""The question box: Enter sends, Shift+Enter adds a line; Send becomes Stop while answering.

Contract: :class:`Composer` emits :attr:`Composer.send_requested` with the text (and
clears itself) or :attr:`Composer.stop_requested`; :meth:`set_busy` and
:meth:`set_blocked` switch it between ready, answering and blocked-with-a-reason.
It grows from one to eight lines as the text grows. The window's shortcuts (Ctrl+N,
Ctrl+F, Ctrl+K) work from the question box too: it leaves those keys to the window
(Ctrl+K would otherwise delete to the end of the line).
"""

from PySide6.QtCore import QEvent, QSize, Qt, Signal
from PySide6.QtGui import QKeyEvent, QKeySequence, QTextCursor
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.widgets.icons import set_icon

MAX_LINES = 8
HINT = "Enter to send · Shift+Enter for a new line"
WINDOW_KEYS = tuple(QKeySequence(k) for k in ("Ctrl+N", "Ctrl+F", "Ctrl+K"))


class InputEdit(QPlainTextEdit):
    """Plain text input whose Enter key submits."""

    submitted = Signal()
    """Enter was pressed without Shift."""

    def event(self, event: QEvent) -> bool:
        if event.type() == QEvent.Type.ShortcutOverride and isinstance(event, QKeyEvent):
            pressed = QKeySequence(event.keyCombination())
            if any(pressed.matches(k) == QKeySequence.SequenceMatch.ExactMatch
                   for k in WINDOW_KEYS):
                event.ignore()  # not ours: let the window's shortcut have it
                return True
        return super().event(event)

    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802
        enter = event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)
        if enter and not event.modifiers() & Qt.KeyboardModifier.ShiftModifier:
            self.submitted.emit()
            return
        if enter:
            self.insertPlainText("\n")
            return
        super().keyPressEvent(event)

    def sizeHint(self) -> QSize:  # noqa: N802
        lines = min(MAX_LINES, max(1, self.document().lineCount()))
        height = lines * self.fontMetrics().lineSpacing() + 14
        return QSize(super().sizeHint().width(), height)


class Composer(QWidget):
    send_requested = Signal(str)
    """The user sent this question."""
    stop_requested = Signal()
    """The user wants the answer stopped."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.busy = False
        self.blocked: str | None = None
        self.input = InputEdit()
        self.input.setObjectName("Input")
        self.input.setPlaceholderText("Ask ANVE anything…")
        self.input.submitted.connect(self.submit)
        self.input.textChanged.connect(self._grow)
        self.button = QPushButton()
        self.button.setObjectName("Primary")
        self.button.setCursor(Qt.CursorShape.PointingHandCursor)
        self.button.clicked.connect(self._clicked)
        frame = QFrame()
        frame.setObjectName("Composer")
        row = QHBoxLayout(frame)
        row.setContentsMargins(10, 6, 6, 6)
        row.addWidget(self.input, 1)
        row.addWidget(self.button, 0, Qt.AlignmentFlag.AlignBottom)
        self.hint = QLabel(HINT)
        self.hint.setObjectName("Hint")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(6)
        layout.addWidget(frame)
        layout.addWidget(self.hint, 0, Qt.AlignmentFlag.AlignHCenter)
        self._grow()
        self._refresh()

    # --- used by the page and by tests ----------------------------------------------------

    def set_text(self, text: str) -> None:
        self.input.setPlainText(text)
        self.input.moveCursor(QTextCursor.MoveOperation.End)

    def text(self) -> str:
        return self.input.toPlainText()

    def submit(self) -> None:
        text = self.text().strip()
        if self.busy or self.blocked is not None or not text:
            return
        self.input.clear()
        self.send_requested.emit(text)

    def set_busy(self, busy: bool) -> None:
        self.busy = busy
        self._refresh()

    def set_blocked(self, reason: str | None) -> None:
        self.blocked = reason
        self._refresh()

    # --- internals -------------------------------------------------------------------

    def _clicked(self) -> None:
        if self.busy:
            self.stop_requested.emit()
        else:
            self.submit()

    def _refresh(self) -> None:
        if self.busy:
            self.button.setText(" Stop")
            set_icon(self.button, "stop", "accent_text", 14)
            self.button.setEnabled(True)
        else:
            self.button.setText(" Send")
            set_icon(self.button, "send", "accent_text", 14)
            self.button.setEnabled(self.blocked is None)
        self.input.setEnabled(self.blocked is None)
        self.input.setPlaceholderText("Please wait…" if self.blocked else "Ask ANVE anything…")
        self.hint.setText(self.blocked or (HINT if not self.busy else "Answering… Stop keeps "
                                           "what is written so far"))

    def _grow(self) -> None:
        full = self.input.document().lineCount() > MAX_LINES
        self.input.setVerticalScrollBarPolicy(
            Qt.ScrollBarPolicy.ScrollBarAsNeeded if full else Qt.ScrollBarPolicy.ScrollBarAlwaysOff
        )
        self.input.setFixedHeight(self.input.sizeHint().height())
