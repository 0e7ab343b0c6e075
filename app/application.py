"""Builds the app: store, worker client, optional launcher, controllers, window.

Contract: :class:`AnveApp` wires everything and owns the shutdown order. With a
``worker_url`` it attaches to that worker and never stops it; otherwise it starts one
(:class:`WorkerLauncher`), restarts it when it dies (the window says so; a partial
answer is kept as interrupted by the chat controller) and stops it on close.
:meth:`start` needs the qasync loop running; :meth:`shutdown` is a coroutine.
"""

import gc
import logging
from pathlib import Path

from PySide6.QtCore import QObject

from app.answer import AnswerStats
from app.client import AnswerResult, WorkerClient
from app.controllers.admin import AdminController
from app.controllers.chat import ChatController
from app.controllers.demo import DemoController
from app.demo import load_prompts
from app.lag import LagMeter
from app.launcher import WorkerCommand, WorkerLauncher
from app.models.answers import RecentAnswersModel
from app.paths import DATABASE_NAME, assets_dir
from app.store import AsyncStore, Store
from app.widgets.main_window import MainWindow

log = logging.getLogger(__name__)


class AnveApp(QObject):
    def __init__(
        self, data_dir: Path, *, worker_url: str | None = None,
        command: WorkerCommand | None = None, token: str | None = None,
        admin_token: str | None = None,
    ) -> None:
        super().__init__()
        self.data_dir = data_dir
        self.db = AsyncStore(Store.open(data_dir / DATABASE_NAME))
        self.client = WorkerClient(worker_url, token=token, admin_token=admin_token, parent=self)
        self.launcher: WorkerLauncher | None = None
        if worker_url is None:
            self.launcher = WorkerLauncher(command or WorkerCommand(), data_dir / "worker.log",
                                           self)
        self.answers = RecentAnswersModel(parent=self)
        self.chat = ChatController(self.db, self.client, self)
        self.demo = DemoController(self.db, self.client, self)
        self.admin = AdminController(self.db, self.client, self)
        prompts = load_prompts(assets_dir() / "demo" / "prompts.json")
        self.window = MainWindow(self.chat, self.demo, self.admin, self.client, self.answers,
                                 prompts)
        self.lag = LagMeter()
        self._closed = False
        self._wire()

    def _wire(self) -> None:
        self.chat.history_loaded.connect(self.answers.reset)
        self.chat.answer_completed.connect(lambda _id, stats: self._measured(stats))
        self.demo.pane_finished.connect(self._demo_measured)
        if self.launcher is not None:
            self.launcher.listened.connect(self.client.set_url)
            self.launcher.exited.connect(self._worker_died)
            self.launcher.gave_up.connect(self.window.show_worker_problem)

    def _measured(self, stats: AnswerStats) -> None:
        if not stats.estimated and stats.tokens_per_second is not None:
            self.answers.add(stats)

    def _demo_measured(self, side: str, result: AnswerResult) -> None:
        self._measured(result.stats)

    def _worker_died(self, why: str) -> None:
        self.client.set_url(None, why)

    def start(self) -> None:
        """Show the window and start everything (with the event loop running)."""
        self.window.show()
        self.client.start()
        if self.launcher is not None:
            self.launcher.start()
        self.chat.load()
        self.demo.load()
        self.admin.load()
        self.lag.start()
        gc.freeze()  # start-up objects live for good: full collections need not rescan them

    async def shutdown(self) -> None:
        """Stop answers (kept as interrupted), the worker we started, then the store."""
        if self._closed:
            return
        self._closed = True
        await self.client.close()
        await self.chat.wait()
        await self.demo.wait()
        await self.admin.wait()
        await self.lag.stop()
        log.info("event-loop lag this session: %s", self.lag.summary())
        if self.launcher is not None:
            self.launcher.stop()
        self.db.close()
