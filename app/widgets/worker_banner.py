"""A strip at the top of the window saying what the worker is doing when it is not ready.

Contract: :meth:`WorkerBanner.show_health` shows loading (message and progress bar),
a load error, or "not answering"; it hides itself when the worker is ready.
:meth:`show_problem` overrides the text (the worker died, is being restarted).
"""

from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QProgressBar, QVBoxLayout, QWidget

from app.client import Health
from app.widgets.icons import icon


class WorkerBanner(QFrame):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("Banner")
        self.icon = QLabel()
        self.text = QLabel()
        self.text.setWordWrap(True)
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setTextVisible(False)
        self.progress.setFixedHeight(6)
        words = QVBoxLayout()
        words.setSpacing(6)
        words.addWidget(self.text)
        words.addWidget(self.progress)
        row = QHBoxLayout(self)
        row.setContentsMargins(24, 10, 24, 10)
        row.setSpacing(12)
        row.addWidget(self.icon)
        row.addLayout(words, 1)
        self.hide()

    def show_health(self, health: Health) -> None:
        if health.ready:
            self.hide()
            return
        loading = health.state in ("loading", "starting")
        self._show(health.blocked_reason() or "", "warning" if loading else "error",
                   health.progress if health.state == "loading" else None)

    def show_problem(self, text: str) -> None:
        self._show(text, "error", None)

    def _show(self, text: str, kind: str, progress: float | None) -> None:
        self.setProperty("kind", kind)
        self.style().polish(self)
        self.icon.setPixmap(icon("activity" if kind == "warning" else "close").pixmap(18, 18))
        self.text.setText(text)
        self.progress.setVisible(progress is not None)
        self.progress.setValue(int((progress or 0.0) * 1000))
        self.show()
