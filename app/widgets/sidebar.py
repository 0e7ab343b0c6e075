"""The left sidebar: brand, page navigation, new chat, search and the conversation list.

Contract: the list view shows :class:`ConversationListModel` (title and, below it, the
time or the search snippet). Rename and delete are in the context menu (and F2 /
Delete; the window adds Ctrl+N for a new chat and Ctrl+F / Ctrl+K to search); a delete
can be undone from a bar at the bottom for :data:`UNDO_MS`, after
which it is final. Search runs :data:`SEARCH_DELAY_MS` after the last keystroke.
"""

from PySide6.QtCore import (
    QModelIndex,
    QPersistentModelIndex,
    QPoint,
    QRect,
    QSize,
    Qt,
    QTimer,
    Signal,
)
from PySide6.QtGui import QColor, QFont, QKeySequence, QPainter, QPainterPath, QShortcut
from PySide6.QtWidgets import (
    QButtonGroup,
    QFrame,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QLineEdit,
    QListView,
    QMenu,
    QPushButton,
    QSizePolicy,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.controllers.chat import ChatController
from app.models.conversations import Roles
from app.theme import colors
from app.widgets.icons import icon, set_icon

UNDO_MS = 8000
SEARCH_DELAY_MS = 200
ROW_HEIGHT = 54
PAGES = (("chat", "chat", "Chat"), ("demo", "zap", "Speed demo"), ("admin", "lock", "Admin"))
Index = QModelIndex | QPersistentModelIndex


class ConversationDelegate(QStyledItemDelegate):
    """Two lines per conversation: the title, then when (or the search snippet)."""

    def sizeHint(self, option: QStyleOptionViewItem, index: Index) -> QSize:  # noqa: N802
        return QSize(option.rect.width(), ROW_HEIGHT)

    def paint(self, painter: QPainter, option: QStyleOptionViewItem, index: Index) -> None:
        c = colors()
        painter.save()
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        rect = option.rect.adjusted(2, 2, -2, -2)  # type: ignore[attr-defined]
        state = option.state  # type: ignore[attr-defined]
        fill = None
        if state & QStyle.StateFlag.State_Selected:
            fill = c.selection
        elif state & QStyle.StateFlag.State_MouseOver:
            fill = c.hover
        if fill is not None:
            path = QPainterPath()
            path.addRoundedRect(rect, 8, 8)
            painter.fillPath(path, QColor(fill))
        text = rect.adjusted(12, 8, -10, -8)
        title_font = QFont(option.font)  # type: ignore[attr-defined]
        title_font.setWeight(QFont.Weight.DemiBold)
        painter.setFont(title_font)
        painter.setPen(QColor(c.text))
        top = QRect(text.left(), text.top(), text.width(), text.height() // 2)
        title = painter.fontMetrics().elidedText(str(index.data()), Qt.TextElideMode.ElideRight,
                                                 top.width())
        painter.drawText(top, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, title)
        small = QFont(option.font)  # type: ignore[attr-defined]
        small.setPixelSize(11)
        painter.setFont(small)
        painter.setPen(QColor(c.muted))
        bottom = QRect(text.left(), top.bottom(), text.width(), text.height() - top.height())
        sub = painter.fontMetrics().elidedText(str(index.data(Roles.SUBTITLE) or ""),
                                               Qt.TextElideMode.ElideRight, bottom.width())
        painter.drawText(bottom, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, sub)
        painter.restore()


class Sidebar(QFrame):
    page_selected = Signal(str)
    """"chat", "demo" or "admin"."""

    def __init__(self, controller: ChatController, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("Sidebar")
        self.setFixedWidth(272)
        self.controller = controller
        self._deleted: int | None = None
        layout = QVBoxLayout(self)
        layout.setContentsMargins(14, 16, 14, 14)
        layout.setSpacing(10)
        layout.addLayout(self._brand())
        layout.addSpacing(4)
        layout.addLayout(self._navigation())
        layout.addSpacing(6)
        self.chat_part = self._chat_part()
        layout.addWidget(self.chat_part, 1)
        controller.conversation_deleted.connect(self._offer_undo)
        controller.conversation_opened.connect(self._select_current)
        controller.conversations.modelReset.connect(self._select_current)
        controller.conversations.rowsInserted.connect(self._select_current)

    def _brand(self) -> QHBoxLayout:
        logo = QLabel()
        logo.setPixmap(icon("anve", size=32).pixmap(32, 32))
        name, sub = QLabel("ANVE"), QLabel("Office assistant · on this appliance")
        name.setObjectName("Brand")
        sub.setObjectName("BrandSub")
        words = QVBoxLayout()
        words.setSpacing(0)
        words.addWidget(name)
        words.addWidget(sub)
        row = QHBoxLayout()
        row.setSpacing(10)
        row.addWidget(logo)
        row.addLayout(words, 1)
        return row

    def _navigation(self) -> QVBoxLayout:
        column = QVBoxLayout()
        column.setSpacing(2)
        self.nav = QButtonGroup(self)
        self.nav_buttons: dict[str, QToolButton] = {}
        for key, icon_name, text in PAGES:
            button = QToolButton()
            button.setObjectName("Nav")
            button.setText(f"  {text}")
            set_icon(button, icon_name, "text", 16)
            button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
            button.setCheckable(True)
            button.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
            button.clicked.connect(lambda _=False, k=key: self.page_selected.emit(k))
            self.nav.addButton(button)
            self.nav_buttons[key] = button
            column.addWidget(button)
        self.nav_buttons["chat"].setChecked(True)
        return column

    def _chat_part(self) -> QWidget:
        part = QWidget()
        layout = QVBoxLayout(part)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(10)
        new = QPushButton("  New chat")
        new.setToolTip("Start a new conversation (Ctrl+N)")
        new.setObjectName("Primary")
        set_icon(new, "plus", "accent_text", 14)
        new.setCursor(Qt.CursorShape.PointingHandCursor)
        new.clicked.connect(self.new_chat)
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search all messages")
        self.search.setToolTip("Search all messages (Ctrl+F or Ctrl+K)")
        self.search.setClearButtonEnabled(True)
        self.search.addAction(icon("search"), QLineEdit.ActionPosition.LeadingPosition)
        self._search_timer = QTimer(self, singleShot=True, interval=SEARCH_DELAY_MS)
        self._search_timer.timeout.connect(lambda: self.controller.search(self.search.text()))
        self.search.textChanged.connect(self._search_changed)
        self.section = QLabel("CONVERSATIONS")
        self.section.setObjectName("Section")
        self.list = self._list_view()
        layout.addWidget(new)
        layout.addWidget(self.search)
        layout.addWidget(self.section)
        layout.addWidget(self.list, 1)
        layout.addWidget(self._undo_bar())
        return part

    def _list_view(self) -> QListView:
        view = QListView()
        view.setObjectName("Conversations")
        view.setModel(self.controller.conversations)
        view.setItemDelegate(ConversationDelegate(view))
        view.setMouseTracking(True)
        view.setVerticalScrollMode(QListView.ScrollMode.ScrollPerPixel)
        view.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        view.customContextMenuRequested.connect(self._menu)
        view.clicked.connect(self._clicked)
        QShortcut(QKeySequence(Qt.Key.Key_F2), view, self._rename_selected)
        QShortcut(QKeySequence(QKeySequence.StandardKey.Delete), view, self._delete_selected)
        return view

    def _undo_bar(self) -> QWidget:
        self.undo_bar = QFrame()
        self.undo_bar.setObjectName("UndoBar")
        row = QHBoxLayout(self.undo_bar)
        row.setContentsMargins(10, 4, 4, 4)
        self.undo_text = QLabel()
        self.undo_button = QToolButton()
        self.undo_button.setObjectName("Link")
        self.undo_button.setText("Undo")
        self.undo_button.clicked.connect(self.undo_delete)
        row.addWidget(self.undo_text, 1)
        row.addWidget(self.undo_button)
        self.undo_bar.hide()
        self._undo_timer = QTimer(self, singleShot=True, interval=UNDO_MS)
        self._undo_timer.timeout.connect(self.confirm_delete)
        return self.undo_bar

    # --- actions (also used by tests) ------------------------------------------------------

    def new_chat(self) -> None:
        self.list.clearSelection()
        self.controller.new_conversation()
        self.page_selected.emit("chat")

    def focus_search(self) -> None:
        self.search.setFocus(Qt.FocusReason.ShortcutFocusReason)
        self.search.selectAll()

    def set_search(self, text: str) -> None:
        self.search.setText(text)
        self._search_timer.stop()
        self.controller.search(text)

    def rename(self, conversation_id: int, title: str) -> None:
        self.controller.rename(conversation_id, title)

    def delete(self, conversation_id: int) -> None:
        self.controller.delete(conversation_id)

    def undo_delete(self) -> None:
        if self._deleted is not None:
            self.controller.undo_delete(self._deleted)
        self._deleted = None
        self._undo_timer.stop()
        self.undo_bar.hide()

    # --- internals ---------------------------------------------------------------------

    def _clicked(self, index: QModelIndex) -> None:
        self.controller.open_conversation(index.data(Roles.ID))
        self.page_selected.emit("chat")

    def _search_changed(self, text: str) -> None:
        self.section.setText("SEARCH RESULTS" if text.strip() else "CONVERSATIONS")
        self._search_timer.start()

    def _menu(self, point: QPoint) -> None:
        index = self.list.indexAt(point)
        if not index.isValid():
            return
        conversation_id, title = index.data(Roles.ID), index.data()
        menu = QMenu(self)
        menu.addAction(icon("edit"), "Rename…", lambda: self._ask_rename(conversation_id, title))
        menu.addAction(icon("trash"), "Delete", lambda: self.delete(conversation_id))
        menu.popup(self.list.viewport().mapToGlobal(point))

    def _ask_rename(self, conversation_id: int, title: str) -> None:
        new, ok = QInputDialog.getText(self, "Rename conversation", "Title", text=title)
        if ok and new.strip():
            self.rename(conversation_id, new)

    def _rename_selected(self) -> None:
        index = self.list.currentIndex()
        if index.isValid():
            self._ask_rename(index.data(Roles.ID), index.data())

    def _delete_selected(self) -> None:
        index = self.list.currentIndex()
        if index.isValid():
            self.delete(index.data(Roles.ID))

    def _offer_undo(self, conversation_id: int, title: str) -> None:
        self._deleted = conversation_id
        short = title if len(title) <= 24 else title[:23] + "…"
        self.undo_text.setText(f"Deleted “{short}”")
        self.undo_bar.show()
        self._undo_timer.start()

    def confirm_delete(self) -> None:
        """Make the last delete final (the undo offer expired)."""
        self._undo_timer.stop()
        self._deleted = None
        self.undo_bar.hide()
        self.controller.forget_deleted()

    def _select_current(self, *_: object) -> None:
        current = self.controller.current
        row = None if current is None else self.controller.conversations.row_of(current.id)
        if row is None:
            self.list.clearSelection()
        else:
            self.list.setCurrentIndex(self.controller.conversations.index(row))

    def show_page(self, key: str) -> None:
        self.nav_buttons[key].setChecked(True)
