"""The messages of the open conversation as a ``QAbstractListModel``.

Contract: one row per message, in order. ``DisplayRole`` is the text; the custom
roles give the rest (:class:`Roles`). The controller changes rows through the
methods here (append, stream text, finish, remove from a row); views only read and
listen to the standard model signals. Rows are keyed by the stored message id.
"""

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from PySide6.QtCore import (
    QAbstractListModel,
    QByteArray,
    QModelIndex,
    QObject,
    QPersistentModelIndex,
    Qt,
)

from app.answer import AnswerStats, footer_text, stored_stats
from app.store import COMPLETE, ERROR, Message

Index = QModelIndex | QPersistentModelIndex


class Roles(IntEnum):
    ID = Qt.ItemDataRole.UserRole + 1
    ROLE = Qt.ItemDataRole.UserRole + 2
    STATUS = Qt.ItemDataRole.UserRole + 3
    STATS = Qt.ItemDataRole.UserRole + 4
    PIECES = Qt.ItemDataRole.UserRole + 5
    STREAMING = Qt.ItemDataRole.UserRole + 6
    FOOTER = Qt.ItemDataRole.UserRole + 7
    NOTE = Qt.ItemDataRole.UserRole + 8


@dataclass
class MessageItem:
    id: int
    role: str
    content: str
    status: str = COMPLETE
    stats: AnswerStats | None = None
    pieces: list[list[Any]] = field(default_factory=list)
    streaming: bool = False
    note: str = ""  # why an answer is interrupted or failed

    @classmethod
    def from_message(cls, message: Message, streaming: bool = False) -> "MessageItem":
        stats = message.stats or {}
        return cls(
            message.id, message.role, message.content, message.status,
            stored_stats(stats), list(message.pieces or []),
            streaming, str(stats.get("note", "")),
        )

    def footer(self) -> str:
        return "" if self.stats is None else footer_text(self.stats)

    @property
    def can_continue(self) -> bool:
        """A finished answer that stopped at its token limit (or the model's context)."""
        return (self.role == "assistant" and self.status == COMPLETE and not self.streaming
                and self.stats is not None and self.stats.finish_reason == "length")


class MessageListModel(QAbstractListModel):
    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.items: list[MessageItem] = []

    # --- QAbstractListModel -----------------------------------------------------------

    def rowCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008, N802
        return 0 if parent.isValid() else len(self.items)

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid() or not 0 <= index.row() < len(self.items):
            return None
        item = self.items[index.row()]
        values: dict[int, Any] = {
            Qt.ItemDataRole.DisplayRole: item.content, Roles.ID: item.id, Roles.ROLE: item.role,
            Roles.STATUS: item.status, Roles.STATS: item.stats, Roles.PIECES: item.pieces,
            Roles.STREAMING: item.streaming, Roles.FOOTER: item.footer(), Roles.NOTE: item.note,
        }
        return values.get(int(role))

    def roleNames(self) -> dict[int, QByteArray]:  # noqa: N802
        names = {int(r): QByteArray(r.name.lower().encode()) for r in Roles}
        return {**names, int(Qt.ItemDataRole.DisplayRole): QByteArray(b"content")}

    # --- changes ----------------------------------------------------------------------

    def reset(self, messages: list[Message]) -> None:
        self.beginResetModel()
        self.items = [MessageItem.from_message(m) for m in messages if m.role != "system"]
        self.endResetModel()

    def append(self, message: Message, streaming: bool = False) -> int:
        row = len(self.items)
        self.beginInsertRows(QModelIndex(), row, row)
        self.items.append(MessageItem.from_message(message, streaming))
        self.endInsertRows()
        return row

    def row_of(self, message_id: int) -> int | None:
        return next((i for i, m in enumerate(self.items) if m.id == message_id), None)

    def stream(self, message_id: int, text: str, pieces: list[list[Any]],
               stats: AnswerStats | None = None, note: str | None = None) -> None:
        """New text of a streaming answer (and its note, unless None)."""
        row = self.row_of(message_id)
        if row is None:
            return
        item = self.items[row]
        item.content, item.pieces, item.stats = text, pieces, stats
        roles: list[Any] = [Qt.ItemDataRole.DisplayRole, Roles.PIECES, Roles.STATS]
        if note is not None and note != item.note:
            item.note = note
            roles.append(Roles.NOTE)
        self._changed(row, roles)

    def finish(self, message_id: int, text: str, pieces: list[list[Any]], status: str,
               stats: AnswerStats | None, note: str = "") -> None:
        row = self.row_of(message_id)
        if row is None:
            return
        item = self.items[row]
        item.content, item.pieces, item.status, item.stats = text, pieces, status, stats
        item.streaming, item.note = False, note
        self._changed(row, [*list(Roles), Qt.ItemDataRole.DisplayRole])

    def mark_streaming(self, message_id: int, note: str | None = None) -> None:
        """An answer streams again (reopened, or being continued: then with a new note)."""
        row = self.row_of(message_id)
        if row is not None:
            self.items[row].streaming = True
            if note is not None:
                self.items[row].note = note
            self._changed(row, [Roles.STREAMING, Roles.NOTE])

    def set_note(self, message_id: int, note: str) -> None:
        row = self.row_of(message_id)
        if row is not None and self.items[row].note != note:
            self.items[row].note = note
            self._changed(row, [Roles.NOTE])

    def remove_from(self, message_id: int) -> None:
        """Remove a message and all after it."""
        row = self.row_of(message_id)
        if row is None:
            return
        self.beginRemoveRows(QModelIndex(), row, len(self.items) - 1)
        del self.items[row:]
        self.endRemoveRows()

    def _changed(self, row: int, roles: list[Any]) -> None:
        index = self.index(row)
        self.dataChanged.emit(index, index, [int(r) for r in roles])

    # --- reading ----------------------------------------------------------------------

    def history(self) -> list[dict[str, str]]:
        """The conversation as the worker reads it: no failed or empty answers."""
        return [
            {"role": m.role, "content": m.content}
            for m in self.items
            if m.content and m.status != ERROR and not m.streaming
        ]

    def last(self, role: str) -> MessageItem | None:
        return next((m for m in reversed(self.items) if m.role == role), None)
