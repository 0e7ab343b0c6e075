"""The chat page: header (title, draft colours, settings, export), messages, composer.

Contract: the page shows :class:`ChatController`'s models and calls its methods; it
never touches the worker or the database. Notices (an interrupted answer, a failure)
appear in a dismissable bar above the composer. Export asks for a file name with a
dialog; :meth:`ChatPage.export_to` does the same without one (tests, scripts).
"""

from pathlib import Path

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import (
    QFileDialog,
    QFrame,
    QHBoxLayout,
    QLabel,
    QMenu,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.controllers.chat import ChatController
from app.export import FORMATS
from app.store import ChatSettings, Conversation
from app.widgets.composer import Composer
from app.widgets.icons import icon
from app.widgets.message_view import COLUMN_WIDTH, ChatView, tool_button
from app.widgets.settings_popover import SettingsPopover

NOTICE_MS = 12000


class ChatPage(QWidget):
    def __init__(self, controller: ChatController, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("Page")
        self.controller = controller
        self.view = ChatView(controller.messages)
        self.view.edit_submitted.connect(controller.edit_and_resend)
        self.view.regenerate_requested.connect(controller.regenerate)
        self.view.continue_requested.connect(controller.continue_answer)
        self.composer = Composer()
        self.composer.send_requested.connect(self._send)
        self.composer.stop_requested.connect(controller.stop)
        self.popover = SettingsPopover(self)
        self.popover.settings_changed.connect(controller.set_settings)
        self.empty = self._empty_state()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        layout.addWidget(self._header())
        layout.addWidget(self.empty, 1)
        layout.addWidget(self.view, 1)
        layout.addWidget(self._bottom())
        self._notice_timer = QTimer(self, singleShot=True, interval=NOTICE_MS)
        self._notice_timer.timeout.connect(self.notice.hide)
        controller.conversation_opened.connect(self._opened)
        controller.conversation_renamed.connect(self._renamed)
        controller.busy_changed.connect(self.composer.set_busy)
        controller.notice_posted.connect(self.show_notice)
        controller.messages.modelReset.connect(self._update_empty)
        controller.messages.rowsInserted.connect(self._update_empty)
        controller.messages.rowsRemoved.connect(self._update_empty)
        self._opened(None)

    # --- building ------------------------------------------------------------------------

    def _header(self) -> QWidget:
        header = QFrame()
        header.setObjectName("ChatHeader")
        row = QHBoxLayout(header)
        row.setContentsMargins(24, 12, 16, 12)
        self.title = QLabel("New conversation")
        self.title.setObjectName("ChatTitle")
        self.colours = tool_button("palette", "Highlight text that came from accepted draft "
                                   "tokens", "Draft colours")
        self.colours.setCheckable(True)
        self.colours.toggled.connect(self.view.set_colour_drafts)
        self.settings_button = tool_button("sliders", "System prompt, temperature, max tokens",
                                           "Settings")
        self.settings_button.clicked.connect(self.open_settings)
        self.export_button = tool_button("export", "Export this conversation", "Export")
        self.export_button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        menu = QMenu(self.export_button)
        menu.addAction("Markdown (.md)…", lambda: self.export_dialog("markdown"))
        menu.addAction("JSON (.json)…", lambda: self.export_dialog("json"))
        self.export_button.setMenu(menu)
        self.export_button.setStyleSheet("QToolButton::menu-indicator { image: none; }")
        row.addWidget(self.title, 1)
        for button in (self.colours, self.settings_button, self.export_button):
            row.addWidget(button)
        return header

    def _empty_state(self) -> QWidget:
        empty = QWidget()
        layout = QVBoxLayout(empty)
        layout.addStretch(2)
        logo = QLabel()
        logo.setPixmap(icon("anve", size=56).pixmap(56, 56))
        logo.setAlignment(Qt.AlignmentFlag.AlignCenter)
        title = QLabel("What can I help you with?")
        title.setObjectName("PageTitle")
        title.setAlignment(Qt.AlignmentFlag.AlignCenter)
        sub = QLabel("Answers are generated on this appliance; nothing leaves the office.")
        sub.setObjectName("PageSub")
        sub.setAlignment(Qt.AlignmentFlag.AlignCenter)
        for widget in (logo, title, sub):
            layout.addWidget(widget)
        layout.addStretch(3)
        return empty

    def _bottom(self) -> QWidget:
        bottom = QWidget()
        outer = QHBoxLayout(bottom)
        outer.setContentsMargins(24, 8, 24, 14)
        column = QVBoxLayout()
        column.setSpacing(8)
        self.notice = QFrame()
        self.notice.setObjectName("Notice")
        notice_row = QHBoxLayout(self.notice)
        notice_row.setContentsMargins(12, 6, 6, 6)
        self.notice_text = QLabel()
        self.notice_text.setWordWrap(True)
        close = tool_button("close", "Dismiss")
        close.clicked.connect(self.notice.hide)
        notice_row.addWidget(self.notice_text, 1)
        notice_row.addWidget(close)
        self.notice.hide()
        column.addWidget(self.notice)
        column.addWidget(self.composer)
        holder = QWidget()
        holder.setMaximumWidth(COLUMN_WIDTH)
        holder.setLayout(column)
        outer.addStretch(1)
        outer.addWidget(holder, 100)
        outer.addStretch(1)
        return bottom

    # --- reacting ------------------------------------------------------------------------

    def _send(self, text: str) -> None:
        if not self.controller.send(text):
            self.composer.set_text(text)

    def _opened(self, conversation: Conversation | None) -> None:
        self.title.setText(conversation.title if conversation else "New conversation")
        self.export_button.setEnabled(conversation is not None)
        self._update_empty()

    def _renamed(self, conversation_id: int, title: str) -> None:
        current = self.controller.current
        if current is not None and current.id == conversation_id:
            self.title.setText(title)

    def _update_empty(self) -> None:
        empty = not self.controller.messages.items
        self.empty.setVisible(empty)
        self.view.setVisible(not empty)

    def show_notice(self, level: str, text: str) -> None:
        self.notice.setProperty("kind", level)
        self.notice.style().polish(self.notice)
        self.notice_text.setText(text)
        self.notice.show()
        self._notice_timer.start()

    def set_blocked(self, reason: str | None) -> None:
        self.composer.set_blocked(reason)

    # --- settings and export -----------------------------------------------------------

    def open_settings(self) -> None:
        self.popover.open_for(self.controller.settings, self.settings_button)

    def apply_settings(self, settings: ChatSettings) -> None:
        self.controller.set_settings(settings)

    def export_dialog(self, fmt: str) -> None:
        current = self.controller.current
        if current is None:
            return
        suffix = FORMATS[fmt]
        name = "".join(c if c.isalnum() or c in " -_" else "_" for c in current.title).strip()
        path, _ = QFileDialog.getSaveFileName(
            self, "Export the conversation", str(Path.home() / f"{name or 'chat'}{suffix}"),
            f"{fmt.title()} (*{suffix})",
        )
        if path:
            self.export_to(Path(path), fmt)

    def export_to(self, path: Path, fmt: str) -> None:
        self.controller.export(path, fmt)
