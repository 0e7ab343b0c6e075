"""Admin controls: a passphrase gate, then live changes to the worker's speculation.

Contract: the passphrase is set on first use and stored only as a salted scrypt hash
(:mod:`app.passphrase`) under the ``admin_passphrase`` setting; hashing and checking
run off the event loop. A wrong passphrase is refused after a short delay. While
unlocked, :meth:`AdminController.apply` sends ``PUT /v1/speculation``; the worker's
answer (``WorkerClient.speculation_received``) is the confirmation shown.
"""

import asyncio
import logging
from typing import Any

from PySide6.QtCore import QObject, Signal

from app.client import WorkerClient
from app.passphrase import hash_passphrase, verify, weakness
from app.store import AsyncStore, Store
from app.tasks import TaskSet

log = logging.getLogger(__name__)

PASSPHRASE_KEY = "admin_passphrase"
REFUSAL_DELAY_S = 0.8


class AdminController(QObject):
    # ---- Signals -----------------------------------------------------------------
    state_loaded = Signal(bool)
    """Whether an admin passphrase has been set."""
    unlocked = Signal()
    """The passphrase was right (or was just set): the controls may show."""
    locked = Signal()
    """The controls were locked again."""
    refused = Signal(str)
    """A passphrase was wrong or too weak; why."""

    def __init__(self, db: AsyncStore, client: WorkerClient, parent: QObject | None = None):
        super().__init__(parent)
        self.db = db
        self.client = client
        self.is_unlocked = False
        self.has_passphrase = False
        self._tasks = TaskSet(lambda what, exc: self.refused.emit(f"{what} failed: {exc}"))

    def load(self) -> None:
        self._tasks.spawn(self._load(), "Reading the admin setting")

    async def _load(self) -> None:
        self.has_passphrase = await self.db.call(Store.setting, PASSPHRASE_KEY) is not None
        self.state_loaded.emit(self.has_passphrase)

    async def wait(self) -> None:
        await self._tasks.wait()

    def set_passphrase(self, passphrase: str, confirmation: str) -> None:
        """Set the first passphrase (refused once one exists)."""
        problem = weakness(passphrase, confirmation)
        if self.has_passphrase:
            problem = "A passphrase is already set."
        if problem is not None:
            self.refused.emit(problem)
            return
        self._tasks.spawn(self._set(passphrase), "Setting the passphrase")

    async def _set(self, passphrase: str) -> None:
        record = await asyncio.to_thread(hash_passphrase, passphrase)
        await self.db.call(Store.set_setting, PASSPHRASE_KEY, record)
        self.has_passphrase = True
        log.info("admin passphrase set")
        self._unlock()

    def unlock(self, passphrase: str) -> None:
        self._tasks.spawn(self._check(passphrase), "Checking the passphrase")

    async def _check(self, passphrase: str) -> None:
        record = await self.db.call(Store.setting, PASSPHRASE_KEY)
        if record is not None and await asyncio.to_thread(verify, passphrase, str(record)):
            self._unlock()
            return
        log.warning("admin unlock refused: wrong passphrase")
        await asyncio.sleep(REFUSAL_DELAY_S)
        self.refused.emit("Wrong passphrase.")

    def _unlock(self) -> None:
        self.is_unlocked = True
        self.unlocked.emit()
        self.client.fetch_speculation()
        self.client.fetch_models()

    def lock(self) -> None:
        self.is_unlocked = False
        self.locked.emit()

    def apply(self, changes: dict[str, Any]) -> bool:
        """Send a speculation change to the worker (only while unlocked)."""
        if not self.is_unlocked:
            self.refused.emit("Unlock the admin controls first.")
            return False
        log.info("admin changes speculation: %s", changes)
        self.client.update_speculation(changes)
        return True
