"""Admin controls: a passphrase gate, then live changes to the worker's speculation.

Contract: the passphrase is set on first use and stored only as a salted scrypt hash
(:mod:`app.passphrase`) under the ``admin_passphrase`` setting; hashing and checking
run off the event loop. A wrong passphrase is refused after a short delay. While
unlocked, :meth:`AdminController.apply` sends ``PUT /v1/speculation``; the worker's
answer (``WorkerClient.speculation_received``) is the confirmation shown.

Which server the app uses is an admin choice too: :meth:`AdminController.choose_server`
checks the address, stores it with its access token under the ``worker`` setting (in
the history file, mode 0600) and emits :attr:`server_chosen`; :meth:`use_local_worker`
clears it. The app attaches to the saved server at start (``anve --worker URL``
overrides it for one session).
"""

import asyncio
import logging
from typing import Any

from PySide6.QtCore import QObject, Signal

from app.client import WorkerClient, normalise_url
from app.passphrase import hash_passphrase, verify, weakness
from app.store import AsyncStore, Store
from app.tasks import TaskSet

log = logging.getLogger(__name__)

PASSPHRASE_KEY = "admin_passphrase"
WORKER_KEY = "worker"  # {"url": ..., "token": ...} of a server to attach to; None: local
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
    server_loaded = Signal(str)
    """The saved server's address ('' for the local worker), once at start."""
    server_chosen = Signal(object, object)
    """The admin chose a server: address and access token (both None: the local worker)."""
    server_refused = Signal(str)
    """A server address could not be used as written; why."""

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
        saved = await self.saved_server()
        self.server_loaded.emit(saved[0] if saved else "")

    async def saved_server(self) -> tuple[str, str | None] | None:
        """The saved server (address, token), or None for the local worker."""
        value = await self.db.call(Store.setting, WORKER_KEY)
        if not isinstance(value, dict) or not value.get("url"):
            return None
        token = value.get("token")
        return str(value["url"]), str(token) if token else None

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

    def choose_server(self, address: str, token: str | None) -> bool:
        """Use (and remember) an OpenAI-compatible server; False when refused at once."""
        if not self.is_unlocked:
            self.server_refused.emit("Unlock the admin controls first.")
            return False
        try:
            url = normalise_url(address)
        except ValueError as exc:
            self.server_refused.emit(str(exc))
            return False
        token = (token or "").strip() or None
        log.info("admin attaches the app to %s", url)
        self._tasks.spawn(self._save_server({"url": url, "token": token}), "Saving the server")
        self.server_chosen.emit(url, token)
        return True

    def use_local_worker(self) -> bool:
        """Go back to the worker the app starts itself (and remember that)."""
        if not self.is_unlocked:
            self.server_refused.emit("Unlock the admin controls first.")
            return False
        log.info("admin switches the app back to its local worker")
        self._tasks.spawn(self._save_server(None), "Saving the server")
        self.server_chosen.emit(None, None)
        return True

    async def _save_server(self, value: dict[str, Any] | None) -> None:
        await self.db.call(Store.set_setting, WORKER_KEY, value)

    def apply(self, changes: dict[str, Any]) -> bool:
        """Send a speculation change to the worker (only while unlocked)."""
        if not self.is_unlocked:
            self.refused.emit("Unlock the admin controls first.")
            return False
        log.info("admin changes speculation: %s", changes)
        self.client.update_speculation(changes)
        return True
