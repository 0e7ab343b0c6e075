"""A small popover with one conversation's system prompt, temperature, max tokens and
what to do when the conversation outgrows the model's context.

Contract: :meth:`SettingsPopover.open_for` shows the given settings under an anchor
widget; when the popover closes and something changed, :attr:`settings_changed`
carries the new :class:`ChatSettings`. "Defaults" restores the app's defaults.
"""

from typing import Any

from PySide6.QtCore import QPoint, Qt, Signal
from PySide6.QtWidgets import (
    QComboBox,
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
from engine.protocol import ROLLING_WINDOW, STOP_AT_LIMIT

OVERFLOW_CHOICES = (
    (ROLLING_WINDOW, "Leave out the oldest messages",
     "Keep the system prompt and the latest messages; the oldest ones are left out (a "
     "rolling window), and the answer says how many"),
    (STOP_AT_LIMIT, "Stop and say so",
     "Refuse the question with a message; start a new chat to go on"),
)


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
        self.max_tokens.setToolTip("The longest answer; one that stops there can be continued")
        self.overflow = QComboBox()
        for value, text, tip in OVERFLOW_CHOICES:
            self.overflow.addItem(text, value)
            self.overflow.setItemData(self.overflow.count() - 1, tip,
                                      Qt.ItemDataRole.ToolTipRole)
        self.overflow.setToolTip("What happens when the conversation no longer fits the "
                                 "model's context")
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
        overflow_label = QLabel("When the conversation no longer fits the model's context")
        overflow_label.setWordWrap(True)
        layout.addWidget(overflow_label)
        layout.addWidget(self.overflow)
        layout.addLayout(buttons)
        self.setFixedWidth(360)

    def _fill(self, settings: ChatSettings) -> None:
        self.system_prompt.setPlainText(settings.system_prompt)
        self.temperature.setValue(settings.temperature)
        self.max_tokens.setValue(settings.max_tokens)
        self.overflow.setCurrentIndex(max(0, self.overflow.findData(settings.context_overflow)))

    def current(self) -> ChatSettings:
        return ChatSettings(system_prompt=self.system_prompt.toPlainText().strip(),
                            temperature=round(self.temperature.value(), 2),
                            max_tokens=self.max_tokens.value(),
                            context_overflow=str(self.overflow.currentData()))

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
