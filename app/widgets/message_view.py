"""The conversation view: one widget per row of :class:`MessageListModel`.

Contract: :class:`ChatView` follows the model's signals (reset, rows inserted and
removed, data changed) and never changes the model itself. Answers are rendered as
Markdown (QLabel's CommonMark) with fenced code blocks in a monospace box with a copy
button; with draft colouring on, text from accepted draft tokens gets a highlight.
While an answer streams only its last block is re-rendered. The view keeps itself
scrolled to the bottom unless the user scrolled up. User actions come out as signals.
The last answer offers Regenerate, and Continue when it stopped at its token limit; a
note under an answer says why it is incomplete (a warning or an error) or what to know
about it (the token limit, messages a rolling context window left out).
"""

from typing import Any

from PySide6.QtCore import (
    QEvent,
    QModelIndex,
    QObject,
    QPersistentModelIndex,
    QSize,
    Qt,
    QTimer,
    Signal,
)
from PySide6.QtGui import QFontDatabase, QGuiApplication, QResizeEvent, QTextCursor
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.markdown import Block, extend_blocks, highlighted_blocks
from app.models.messages import MessageItem, MessageListModel
from app.store import COMPLETE, ERROR
from app.theme import colors
from app.widgets.icons import set_icon

COLUMN_WIDTH = 820
Index = QModelIndex | QPersistentModelIndex


def monospace_font() -> Any:
    font = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
    font.setPointSizeF(max(font.pointSizeF(), 9.5))
    return font


def tool_button(name: str, tip: str, text: str = "") -> QToolButton:
    button = QToolButton()
    set_icon(button, name, "muted", 16)
    button.setToolTip(tip)
    button.setCursor(Qt.CursorShape.PointingHandCursor)
    if text:
        button.setText(text)
        button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
    return button


# --- blocks --------------------------------------------------------------------------


class TextBlock(QLabel):
    """A paragraph of Markdown (or highlighted plain text).

    Its height for a width is cached until the text changes: layouts ask every label
    again whenever one grows, and rich-text layout is what makes long answers slow.
    """

    def __init__(self) -> None:
        super().__init__()
        self.setWordWrap(True)
        self.setTextInteractionFlags(Qt.TextInteractionFlag.TextBrowserInteraction)
        self.setOpenExternalLinks(True)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Preferred)
        self._heights: dict[int, int] = {}

    def show_markdown(self, text: str) -> None:
        self._show(text, Qt.TextFormat.MarkdownText)

    def show_html(self, html: str) -> None:
        self._show(html, Qt.TextFormat.RichText)

    def _show(self, text: str, fmt: Qt.TextFormat) -> None:
        if text == self.text() and fmt == self.textFormat():
            return
        self._heights.clear()
        self.setTextFormat(fmt)
        self.setText(text)

    def heightForWidth(self, width: int) -> int:  # noqa: N802
        if width not in self._heights:
            self._heights[width] = super().heightForWidth(width)
        return self._heights[width]

    def minimumSizeHint(self) -> QSize:  # noqa: N802
        """No height of its own: the layout asks :meth:`heightForWidth` (else a long
        paragraph's guessed height at a narrow width would make the column too tall)."""
        return QSize(super().minimumSizeHint().width(), 0)

    def changeEvent(self, event: QEvent) -> None:  # noqa: N802
        if event.type() in (QEvent.Type.FontChange, QEvent.Type.StyleChange):
            self._heights.clear()
        super().changeEvent(event)


class CodeBlock(QFrame):
    """A fenced code block: language, copy button, monospace text scrolling sideways."""

    def __init__(self) -> None:
        super().__init__()
        self.setObjectName("CodeBlock")
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)
        self.language = QLabel()
        self.language.setObjectName("CodeLanguage")
        self.copy = tool_button("copy", "Copy the code", "Copy")
        self.copy.clicked.connect(self._copy)
        header = QFrame()
        header.setObjectName("CodeHeader")
        row = QHBoxLayout(header)
        row.setContentsMargins(12, 2, 4, 2)
        row.addWidget(self.language)
        row.addStretch()
        row.addWidget(self.copy)
        self._text = ""
        self._fitted: tuple[str, int] | None = None
        self.code = QPlainTextEdit()
        self.code.setObjectName("CodeText")
        self.code.setReadOnly(True)
        self.code.setFrameShape(QFrame.Shape.NoFrame)
        self.code.setFont(monospace_font())
        self.code.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.code.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.code.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        layout.addWidget(header)
        layout.addWidget(self.code)

    def show_code(self, block: Block) -> None:
        """Show the code; text that only grew (streaming) is appended, not re-laid out."""
        self.language.setText(block.language or "code")
        if block.text == self._text:
            return
        if self._text and block.text.startswith(self._text):
            cursor = QTextCursor(self.code.document())
            cursor.movePosition(QTextCursor.MoveOperation.End)
            cursor.insertText(block.text[len(self._text) :])
        else:
            self.code.setPlainText(block.text)
        self._text = block.text
        self._fit()

    def _fit(self) -> None:
        """Make the box exactly as tall as its lines (plus a scroll bar if they are wide)."""
        key = (self._text, self.code.viewport().width())
        if key == self._fitted:
            return
        self._fitted = key
        code = self.code
        code.ensurePolished()  # the stylesheet's padding counts in the height
        lines = max(1, code.document().blockCount())
        line = code.blockBoundingRect(code.document().firstBlock()).height()
        line = line or code.fontMetrics().lineSpacing()
        bar = code.horizontalScrollBar()
        margins, viewport = code.contentsMargins(), code.viewportMargins()
        chrome = margins.top() + margins.bottom() + viewport.top() + viewport.bottom()
        needs_bar = code.document().idealWidth() > code.viewport().width()
        text_height = lines * line + 2 * code.document().documentMargin() + 2
        code.setFixedHeight(int(text_height) + chrome + (bar.sizeHint().height() if needs_bar
                                                         else 0))

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802
        super().resizeEvent(event)
        if event.size().width() != event.oldSize().width():
            self._fit()

    def _copy(self) -> None:
        QGuiApplication.clipboard().setText(self.code.toPlainText())
        self.copy.setText("Copied")
        QTimer.singleShot(1500, self.copy, lambda: self.copy.setText("Copy"))


class MarkdownBody(QWidget):
    """Answer text as a stack of prose and code blocks, updated incrementally."""

    def __init__(self) -> None:
        super().__init__()
        self._layout = QVBoxLayout(self)
        self._layout.setContentsMargins(0, 0, 0, 0)
        self._layout.setSpacing(10)
        self._blocks: list[Block] = []
        self._widgets: list[QWidget] = []
        self._source_blocks: list[Block] = []

    def show_text(self, text: str, pieces: list[list[Any]], colour_drafts: bool) -> None:
        blocks = highlighted_blocks(text, pieces, colors().draft) if colour_drafts else []
        if not blocks:
            self._source_blocks = extend_blocks(self._source_blocks, text)
            blocks = [b for b in self._source_blocks if b.kind == "code" or b.text]
        self._show_blocks(blocks)

    def _show_blocks(self, blocks: list[Block]) -> None:
        """Keep unchanged leading blocks, update the first changed one in place if it is
        of the same kind (the streaming case), and rebuild the rest."""
        same = 0
        while same < min(len(blocks), len(self._blocks)) and blocks[same] == self._blocks[same]:
            same += 1
        reuse = int(same < min(len(blocks), len(self._blocks))
                    and blocks[same].kind == self._blocks[same].kind)
        for old in self._widgets[same + reuse :]:
            old.deleteLater()
        del self._widgets[same + reuse :]
        if reuse:
            self._fill(self._widgets[same], blocks[same])
        for block in blocks[same + reuse :]:
            widget: QWidget = CodeBlock() if block.kind == "code" else TextBlock()
            self._fill(widget, block)
            self._layout.addWidget(widget)
            widget.show()  # count in the layout now, not after a posted show
            self._widgets.append(widget)
        self._blocks = blocks

    @staticmethod
    def _fill(widget: QWidget, block: Block) -> None:
        if isinstance(widget, CodeBlock):
            widget.show_code(block)
        elif isinstance(widget, TextBlock) and block.kind == "html":
            widget.show_html(block.text)
        elif isinstance(widget, TextBlock):
            widget.show_markdown(block.text)


# --- one message ------------------------------------------------------------------------


class MessageWidget(QWidget):
    """A question (right, in a bubble) or an answer (left, full width, with a footer)."""

    edit_submitted = Signal(int, str)
    """Message id and the edited question to send again."""
    regenerate_requested = Signal()
    """The user wants the last answer again."""
    continue_requested = Signal()
    """The user wants the last answer continued past its token limit."""

    def __init__(self, item: MessageItem) -> None:
        super().__init__()
        self.item = item
        self.colour_drafts = False
        self.is_last = False
        self._actions_shown: dict[str, bool] = {}  # what the answer's buttons were set to
        self._layout = QVBoxLayout(self)
        self._layout.setContentsMargins(0, 0, 0, 0)
        self._layout.setSpacing(4)
        if item.role == "user":
            self._build_question()
        else:
            self._build_answer()
        self.show_item(item)

    def _build_question(self) -> None:
        self.bubble = QFrame()
        self.bubble.setObjectName("UserBubble")
        inner = QVBoxLayout(self.bubble)
        inner.setContentsMargins(14, 10, 14, 10)
        self.question = TextBlock()
        self.question.setTextFormat(Qt.TextFormat.PlainText)
        self.editor = QPlainTextEdit()
        self.editor.setMinimumWidth(420)
        self.editor.hide()
        inner.addWidget(self.question)
        inner.addWidget(self.editor)
        self.edit_row = QWidget()
        edit_buttons = QHBoxLayout(self.edit_row)
        edit_buttons.setContentsMargins(0, 4, 0, 0)
        edit_buttons.addStretch()
        cancel, resend = QPushButton("Cancel"), QPushButton("Send again")
        resend.setObjectName("Primary")
        cancel.clicked.connect(self.cancel_edit)
        resend.clicked.connect(self.submit_edit)
        edit_buttons.addWidget(cancel)
        edit_buttons.addWidget(resend)
        self.edit_row.hide()
        inner.addWidget(self.edit_row)
        self.edit = tool_button("edit", "Edit this question and send it again", "Edit")
        self.edit.clicked.connect(self.start_edit)
        row = QHBoxLayout()
        row.addStretch(1)
        row.addWidget(self.bubble, 0)
        self._layout.addLayout(row)
        actions = QHBoxLayout()
        actions.addStretch()
        actions.addWidget(self.edit)
        self._layout.addLayout(actions)

    def _build_answer(self) -> None:
        who = QLabel("ANVE")
        who.setObjectName("Who")
        self.body = MarkdownBody()
        self.note = QLabel()
        self.note.setObjectName("Note")
        self.note.setWordWrap(True)
        self.footer = QLabel()
        self.footer.setObjectName("Footer")
        self.footer.setWordWrap(True)
        self.copy_all = tool_button("copy", "Copy the answer")
        self.copy_all.clicked.connect(
            lambda: QGuiApplication.clipboard().setText(self.item.content))
        self.regenerate = tool_button("refresh", "Answer this question again", "Regenerate")
        self.regenerate.clicked.connect(self.regenerate_requested)
        self.continue_button = tool_button("play", "Write more of this answer, from where the "
                                           "token limit stopped it", "Continue")
        self.continue_button.clicked.connect(self.continue_requested)
        footer_row = QHBoxLayout()
        footer_row.setSpacing(6)
        footer_row.addWidget(self.footer, 1)
        footer_row.addWidget(self.copy_all)
        footer_row.addWidget(self.continue_button)
        footer_row.addWidget(self.regenerate)
        self._layout.addWidget(who)
        self._layout.addWidget(self.body)
        self._layout.addWidget(self.note)
        self._layout.addLayout(footer_row)

    def show_item(self, item: MessageItem) -> None:
        self.item = item
        if item.role == "user":
            self.question.setText(item.content)
            limit = int(COLUMN_WIDTH * 0.8)
            lines = item.content.splitlines() or [""]
            self.question.ensurePolished()
            natural = max(self.question.fontMetrics().horizontalAdvance(line) for line in lines)
            self.question.setMinimumWidth(min(natural + 4, limit - 28))
            self.bubble.setMaximumWidth(limit)
            return
        text = item.content or ("…" if item.streaming else "")
        self.body.show_text(text, item.pieces, self.colour_drafts)
        self.note.setText(item.note)
        kind = {ERROR: "error", COMPLETE: "info"}.get(item.status, "warning")
        self.note.setProperty("kind", kind)
        self.note.style().polish(self.note)
        self.note.setVisible(bool(item.note))
        self.footer.setText(item.footer() if item.stats else ("Answering…" if item.streaming
                                                                else ""))
        self._update_actions()

    def set_last(self, last: bool) -> None:
        self.is_last = last
        self._update_actions()

    def _update_actions(self) -> None:
        """Show the answer's actions that apply now. Qt is told only of changes: this runs
        at every live update, and each binding call costs (PySide6 6.12 on Python 3.11
        even loses a reference to ``None`` per call; see tests/test_app_soak.py)."""
        if self.item.role == "user":
            return
        shown = {
            "regenerate": self.is_last and not self.item.streaming,
            "continue": self.is_last and self.item.can_continue,
            "copy": not self.item.streaming and bool(self.item.content),
        }
        buttons = {"regenerate": self.regenerate, "continue": self.continue_button,
                   "copy": self.copy_all}
        for name, visible in shown.items():
            if self._actions_shown.get(name) != visible:
                self._actions_shown[name] = visible
                buttons[name].setVisible(visible)

    def set_colour_drafts(self, on: bool) -> None:
        self.colour_drafts = on
        self.show_item(self.item)

    def start_edit(self) -> None:
        self.editor.setPlainText(self.item.content)
        self.question.hide()
        self.edit.hide()
        self.editor.show()
        self.edit_row.show()
        self.editor.setFocus()

    def cancel_edit(self) -> None:
        self.editor.hide()
        self.edit_row.hide()
        self.question.show()
        self.edit.show()

    def submit_edit(self) -> None:
        text = self.editor.toPlainText().strip()
        self.cancel_edit()
        if text:
            self.edit_submitted.emit(self.item.id, text)


# --- the conversation --------------------------------------------------------------------


class ChatView(QScrollArea):
    """Scrollable column of :class:`MessageWidget` s following a :class:`MessageListModel`."""

    edit_submitted = Signal(int, str)
    """Message id and new question text."""
    regenerate_requested = Signal()
    """Regenerate the last answer."""
    continue_requested = Signal()
    """Continue the last answer past its token limit."""

    def __init__(self, model: MessageListModel, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("Messages")
        self.setWidgetResizable(False)  # sized here, from heightForWidth, in one pass
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.model = model
        self.colour_drafts = False
        self.widgets: list[MessageWidget] = []
        self._stick = True
        inner = QWidget()
        inner.setObjectName("MessagesInner")
        outer = QHBoxLayout(inner)
        outer.setContentsMargins(24, 20, 24, 20)
        self.column = QVBoxLayout()
        self.column.setSpacing(18)
        self.column.addStretch(1)
        column_widget = QWidget()
        column_widget.setMaximumWidth(COLUMN_WIDTH)
        column_widget.setLayout(self.column)
        outer.addStretch(1)
        outer.addWidget(column_widget, 100)
        outer.addStretch(1)
        self.setWidget(inner)
        inner.installEventFilter(self)
        self.verticalScrollBar().rangeChanged.connect(self._range_changed)
        self.verticalScrollBar().valueChanged.connect(self._scrolled)
        model.modelReset.connect(self._reset)
        model.rowsInserted.connect(self._inserted)
        model.rowsRemoved.connect(self._removed)
        model.dataChanged.connect(self._changed)
        self._reset()

    def _make(self, item: MessageItem) -> MessageWidget:
        widget = MessageWidget(item)
        widget.colour_drafts = self.colour_drafts
        widget.edit_submitted.connect(self.edit_submitted)
        widget.regenerate_requested.connect(self.regenerate_requested)
        widget.continue_requested.connect(self.continue_requested)
        return widget

    def _reset(self) -> None:
        for widget in self.widgets:
            widget.deleteLater()
        self.widgets = []
        self._inserted(QModelIndex(), 0, len(self.model.items) - 1)
        self._stick = True

    def _inserted(self, parent: Index, first: int, last: int) -> None:
        if any(self.model.items[row].role == "user" for row in range(first, last + 1)):
            self._stick = True  # a new question: follow the conversation again
        for row in range(first, last + 1):
            widget = self._make(self.model.items[row])
            self.widgets.insert(row, widget)
            self.column.insertWidget(row, widget)
            widget.show_item(self.model.items[row])
            widget.show()
        self._mark_last()

    def _removed(self, parent: Index, first: int, last: int) -> None:
        for widget in self.widgets[first : last + 1]:
            widget.deleteLater()
        del self.widgets[first : last + 1]
        self._mark_last()

    def _changed(self, top: Index, bottom: Index, roles: Any = ()) -> None:
        for row in range(top.row(), bottom.row() + 1):
            if 0 <= row < len(self.widgets):
                self.widgets[row].show_item(self.model.items[row])
        self._fit_inner()

    def _mark_last(self) -> None:
        for i, widget in enumerate(self.widgets):
            widget.set_last(i == len(self.widgets) - 1)
        self._fit_inner()

    def _fit_inner(self) -> None:
        """Give the column exactly the height its messages need at the view's width.

        Done here, at once, rather than by QScrollArea after a posted layout request:
        that way one layout pass per update suffices and nothing is squeezed meanwhile.
        """
        inner, viewport = self.widget(), self.viewport()
        if inner is None:
            return
        width = viewport.width()
        height = max(inner.heightForWidth(width), viewport.height())
        if inner.width() != width or inner.height() != height:
            inner.resize(width, height)

    def viewportEvent(self, event: QEvent) -> bool:  # noqa: N802
        if event.type() == QEvent.Type.Resize:
            self._fit_inner()
        return super().viewportEvent(event)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802
        """Refit the column when its layout asks (fonts, styles or sizes changed later)."""
        if watched is self.widget() and event.type() == QEvent.Type.LayoutRequest:
            self._fit_inner()
        return False

    def set_colour_drafts(self, on: bool) -> None:
        self.colour_drafts = on
        for widget in self.widgets:
            widget.set_colour_drafts(on)
        self._fit_inner()

    def refresh(self) -> None:
        """Render everything again (after a theme change)."""
        self.set_colour_drafts(self.colour_drafts)

    def _scrolled(self, value: int) -> None:
        bar = self.verticalScrollBar()
        self._stick = value >= bar.maximum() - 24

    def _range_changed(self, low: int, high: int) -> None:
        if self._stick:
            self.verticalScrollBar().setValue(high)
