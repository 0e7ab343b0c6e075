"""Conversations (or search hits) for the sidebar, as a ``QAbstractListModel``.

Contract: rows are :class:`app.store.Conversation` records, most recent first.
``DisplayRole`` is the title; ``SUBTITLE`` is the search snippet when searching,
else when the conversation was last active. The controller changes rows; views read.
"""

import time
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

from app.store import Conversation

Index = QModelIndex | QPersistentModelIndex


class Roles(IntEnum):
    ID = Qt.ItemDataRole.UserRole + 1
    SUBTITLE = Qt.ItemDataRole.UserRole + 2
    CONVERSATION = Qt.ItemDataRole.UserRole + 3


def when(timestamp: float, now: float | None = None) -> str:
    """A short, human date: "just now", "5 min ago", "yesterday", "3 Mar"."""
    now = time.time() if now is None else now
    ago = max(0.0, now - timestamp)
    if ago < 60:
        return "just now"
    if ago < 3600:
        return f"{int(ago // 60)} min ago"
    day, today = time.localtime(timestamp), time.localtime(now)
    if day.tm_yday == today.tm_yday and day.tm_year == today.tm_year:
        return time.strftime("%H:%M", day)
    if ago < 2 * 86400:
        return "yesterday"
    return time.strftime("%-d %b", day)


class ConversationListModel(QAbstractListModel):
    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.items: list[Conversation] = []
        self.searching = False

    def rowCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008, N802
        return 0 if parent.isValid() else len(self.items)

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid() or not 0 <= index.row() < len(self.items):
            return None
        item = self.items[index.row()]
        if role in (Qt.ItemDataRole.DisplayRole, Qt.ItemDataRole.ToolTipRole):
            return item.title
        if role == Roles.ID:
            return item.id
        if role == Roles.SUBTITLE:
            return item.snippet if self.searching else when(item.updated)
        if role == Roles.CONVERSATION:
            return item
        return None

    def roleNames(self) -> dict[int, QByteArray]:  # noqa: N802
        names = {int(r): QByteArray(r.name.lower().encode()) for r in Roles}
        return {**names, int(Qt.ItemDataRole.DisplayRole): QByteArray(b"title")}

    def reset(self, conversations: list[Conversation], searching: bool = False) -> None:
        self.beginResetModel()
        self.items, self.searching = list(conversations), searching
        self.endResetModel()

    def row_of(self, conversation_id: int) -> int | None:
        return next((i for i, c in enumerate(self.items) if c.id == conversation_id), None)

    def put_first(self, conversation: Conversation) -> None:
        """Insert or move a conversation to the top (it was just active)."""
        if self.searching:
            return
        row = self.row_of(conversation.id)
        if row is not None:
            self.remove(conversation.id)
        self.beginInsertRows(QModelIndex(), 0, 0)
        self.items.insert(0, conversation)
        self.endInsertRows()

    def remove(self, conversation_id: int) -> None:
        row = self.row_of(conversation_id)
        if row is None:
            return
        self.beginRemoveRows(QModelIndex(), row, row)
        del self.items[row]
        self.endRemoveRows()

    def replace(self, conversation: Conversation) -> None:
        row = self.row_of(conversation.id)
        if row is None:
            return
        self.items[row] = conversation
        index = self.index(row)
        self.dataChanged.emit(index, index)
