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

"Learn from this office": :meth:`AdminController.learn_from_office` reads the newest
answered chats from the history (off the event loop) and hands them to our worker,
which fine-tunes its EAGLE draft head in the background at low priority and swaps it in
only if it drafts better on chats it did not train on. While a run goes on the status
is polled every ``LEARNING_POLL_S``; :attr:`learning_changed` carries each status and
the speculation setting is read again when the run ends (``eagle`` may be new).
"""

import asyncio
import logging
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal

from app.client import WorkerClient, normalise_url
from app.passphrase import hash_passphrase, verify, weakness
from app.store import AsyncStore, Store
from app.tasks import TaskSet

log = logging.getLogger(__name__)

PASSPHRASE_KEY = "admin_passphrase"
WORKER_KEY = "worker"  # {"url": ..., "token": ...} of a server to attach to; None: local
REFUSAL_DELAY_S = 0.8
LEARNING_POLL_S = 2.0
# of chat text sent to the worker: its body limit is 2 MiB and JSON may spend 6 bytes on a
# character; the training reads 20,000 tokens (about 80,000 characters) by default
LEARNING_MAX_CHARS = 300_000


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
    learning_changed = Signal(dict)
    """The worker's head-learning status (state, message, conversations, acceptance)."""
    learning_refused = Signal(str)
    """Learning could not start, be read or be stopped; why."""

    def __init__(self, db: AsyncStore, client: WorkerClient, parent: QObject | None = None):
        super().__init__(parent)
        self.db = db
        self.client = client
        self.is_unlocked = False
        self.has_passphrase = False
        self._tasks = TaskSet(lambda what, exc: self.refused.emit(f"{what} failed: {exc}"))
        self.learning_state = "idle"
        self._poll = QTimer(self)
        self._poll.setSingleShot(True)
        self._poll.setInterval(int(LEARNING_POLL_S * 1000))
        self._poll.timeout.connect(client.fetch_learning)
        client.learning_received.connect(self._learning_received)
        client.learning_failed.connect(self.learning_refused)

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
        self.client.fetch_learning()

    def _unlocked_or_say(self, refused: Any) -> bool:
        """Whether the controls are unlocked; if not, say so through ``refused``."""
        if not self.is_unlocked:
            refused.emit("Unlock the admin controls first.")
        return self.is_unlocked

    def lock(self) -> None:
        self.is_unlocked = False
        self.locked.emit()

    def choose_server(self, address: str, token: str | None) -> bool:
        """Use (and remember) an OpenAI-compatible server; False when refused at once."""
        if not self._unlocked_or_say(self.server_refused):
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
        if not self._unlocked_or_say(self.server_refused):
            return False
        log.info("admin switches the app back to its local worker")
        self._tasks.spawn(self._save_server(None), "Saving the server")
        self.server_chosen.emit(None, None)
        return True

    async def _save_server(self, value: dict[str, Any] | None) -> None:
        await self.db.call(Store.set_setting, WORKER_KEY, value)

    def apply(self, changes: dict[str, Any]) -> bool:
        """Send a speculation change to the worker (only while unlocked)."""
        if not self._unlocked_or_say(self.refused):
            return False
        log.info("admin changes speculation: %s", changes)
        self.client.update_speculation(changes)
        return True

    def learn_from_office(self, tuning: dict[str, int] | None = None) -> bool:
        """Send the office's past chats to the worker to train its draft head on."""
        if not self._unlocked_or_say(self.learning_refused):
            return False
        self._tasks.spawn(self._learn(tuning), "Reading the chat history")
        return True

    async def _learn(self, tuning: dict[str, int] | None) -> None:
        chats = await self.db.call(Store.answered_chats, LEARNING_MAX_CHARS)
        if not chats:
            self.learning_refused.emit("There are no answered chats to learn from yet.")
            return
        log.info("admin starts head learning on %d chats", len(chats))
        self.client.start_learning(chats, tuning)

    def stop_learning(self) -> None:
        if not self._unlocked_or_say(self.learning_refused):
            return
        log.info("admin stops the head learning")
        self.client.stop_learning()

    def _learning_received(self, status: dict[str, Any]) -> None:
        state = str(status.get("state") or "idle")
        if self.learning_state == "running" and state != "running":
            self.client.fetch_speculation()  # a new head may have added eagle
        self.learning_state = state
        if state == "running":
            self._poll.start()
        self.learning_changed.emit(status)
