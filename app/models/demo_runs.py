"""Saved side-by-side demo runs, newest first, as a ``QAbstractListModel``.

Contract: rows are :class:`app.store.DemoRun`; ``DisplayRole`` is a one-line summary
(when, method, speedup end to end as the page shows it, identical or not), ``RUN`` the
record.
"""

import time
from enum import IntEnum
from typing import Any

from PySide6.QtCore import QAbstractListModel, QModelIndex, QObject, QPersistentModelIndex, Qt

from app.answer import method_name
from app.demo import side_stats, speedups
from app.store import DemoRun

Index = QModelIndex | QPersistentModelIndex


class Roles(IntEnum):
    RUN = Qt.ItemDataRole.UserRole + 1


def summary(run: DemoRun) -> str:
    when = time.strftime("%d %b %H:%M", time.localtime(run.created))
    ratio = speedups(side_stats(run.plain)[1], side_stats(run.speculative)[1]).total
    speed = f"{ratio:.2f}× faster" if ratio else "speed not measured"
    same = "identical" if run.identical else "outputs differ"
    prompt = " ".join(run.prompt.split())
    prompt = prompt if len(prompt) <= 40 else prompt[:39] + "…"
    return f"{when} · {method_name(run.method)} · {speed} · {same} — {prompt}"


class DemoRunListModel(QAbstractListModel):
    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.items: list[DemoRun] = []

    def rowCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008, N802
        return 0 if parent.isValid() else len(self.items)

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid() or not 0 <= index.row() < len(self.items):
            return None
        run = self.items[index.row()]
        if role in (Qt.ItemDataRole.DisplayRole, Qt.ItemDataRole.ToolTipRole):
            return summary(run)
        if role == Roles.RUN:
            return run
        return None

    def reset(self, runs: list[DemoRun]) -> None:
        self.beginResetModel()
        self.items = list(runs)
        self.endResetModel()

    def prepend(self, run: DemoRun) -> None:
        self.beginInsertRows(QModelIndex(), 0, 0)
        self.items.insert(0, run)
        self.endInsertRows()
