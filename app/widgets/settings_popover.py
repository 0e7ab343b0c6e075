"""A small popover with one conversation's system prompt, temperature and max tokens.

Contract: :meth:`SettingsPopover.open_for` shows the given settings under an anchor
widget; when the popover closes and something changed, :attr:`settings_changed`
carries the new :class:`ChatSettings`. "Defaults" restores the app's defaults.
"""

from typing import Any

from PySide6.QtCore import QPoint, Qt, Signal
from PySide6.QtWidgets import (
    QDoubleSpinBox,
    QFormLayout,
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.store import ChatSettings
from app.theme import pad_spin_box


class SettingsPopover(QFrame):
    settings_changed = Signal(object)
    """The edited :class:`ChatSettings` (only when something changed)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent, Qt.WindowType.Popup)
        self.setObjectName("Popover")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        self._initial = ChatSettings()
        title = QLabel("Conversation settings")
        title.setObjectName("CardTitle")
        self.system_prompt = QPlainTextEdit()
        self.system_prompt.setPlaceholderText("How ANVE should behave in this conversation")
        self.system_prompt.setFixedHeight(84)
        self.temperature = pad_spin_box(QDoubleSpinBox())
        self.temperature.setRange(0.0, 2.0)
        self.temperature.setSingleStep(0.1)
        self.temperature.setDecimals(2)
        self.temperature.setToolTip("0 answers the same every time; higher is more varied")
        self.max_tokens = pad_spin_box(QSpinBox())
        self.max_tokens.setRange(16, 8192)
        self.max_tokens.setSingleStep(64)
        form = QFormLayout()
        form.setLabelAlignment(Qt.AlignmentFlag.AlignLeft)
        form.addRow("Temperature", self.temperature)
        form.addRow("Max tokens", self.max_tokens)
        defaults = QPushButton("Defaults")
        defaults.clicked.connect(lambda: self._fill(ChatSettings()))
        done = QPushButton("Done")
        done.setObjectName("Primary")
        done.clicked.connect(self.close)
        buttons = QHBoxLayout()
        buttons.addWidget(defaults)
        buttons.addStretch()
        buttons.addWidget(done)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(16, 14, 16, 14)
        layout.setSpacing(10)
        layout.addWidget(title)
        layout.addWidget(QLabel("System prompt"))
        layout.addWidget(self.system_prompt)
        layout.addLayout(form)
        layout.addLayout(buttons)
        self.setFixedWidth(360)

    def _fill(self, settings: ChatSettings) -> None:
        self.system_prompt.setPlainText(settings.system_prompt)
        self.temperature.setValue(settings.temperature)
        self.max_tokens.setValue(settings.max_tokens)

    def current(self) -> ChatSettings:
        return ChatSettings(self.system_prompt.toPlainText().strip(),
                            round(self.temperature.value(), 2), self.max_tokens.value())

    def open_for(self, settings: ChatSettings, anchor: QWidget) -> None:
        self._initial = settings
        self._fill(settings)
        self.adjustSize()
        below = anchor.mapToGlobal(QPoint(anchor.width() - self.width(), anchor.height() + 4))
        self.move(below)
        self.show()

    def hideEvent(self, event: Any) -> None:  # noqa: N802
        super().hideEvent(event)
        if self.current() != self._initial:
            self._initial = self.current()
            self.settings_changed.emit(self._initial)
