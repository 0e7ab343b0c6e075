"""The latest answers' statistics, oldest first, for the panel's live chart.

Contract: a ``QAbstractListModel`` of :class:`app.answer.AnswerStats` holding at most
``capacity`` rows; :meth:`RecentAnswersModel.add` drops the oldest when full.
``DisplayRole`` is the footer line; ``STATS`` the record.
"""

from enum import IntEnum
from typing import Any

from PySide6.QtCore import QAbstractListModel, QModelIndex, QObject, QPersistentModelIndex, Qt

from app.answer import AnswerStats, footer_text

Index = QModelIndex | QPersistentModelIndex


class Roles(IntEnum):
    STATS = Qt.ItemDataRole.UserRole + 1


class RecentAnswersModel(QAbstractListModel):
    def __init__(self, capacity: int = 30, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.capacity = capacity
        self.items: list[AnswerStats] = []

    def rowCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008, N802
        return 0 if parent.isValid() else len(self.items)

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid() or not 0 <= index.row() < len(self.items):
            return None
        if role == Qt.ItemDataRole.DisplayRole:
            return footer_text(self.items[index.row()])
        if role == Roles.STATS:
            return self.items[index.row()]
        return None

    def reset(self, stats: list[AnswerStats]) -> None:
        self.beginResetModel()
        self.items = list(stats)[-self.capacity :]
        self.endResetModel()

    def add(self, stats: AnswerStats) -> None:
        if len(self.items) >= self.capacity:
            self.beginRemoveRows(QModelIndex(), 0, 0)
            del self.items[0]
            self.endRemoveRows()
        row = len(self.items)
        self.beginInsertRows(QModelIndex(), row, row)
        self.items.append(stats)
        self.endInsertRows()
