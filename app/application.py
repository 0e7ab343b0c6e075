"""Builds the app: store, worker client, optional launcher, controllers, window.

Contract: :class:`AnveApp` wires everything and owns the shutdown order. With a
``worker_url`` it attaches to that server (our worker or any OpenAI-compatible one) and
never stops it; otherwise it attaches to the server saved in Admin, if any, or starts
its own worker (:class:`WorkerLauncher`), restarts it when it dies (the window says so;
a partial answer is kept as interrupted by the chat controller, whose note then says the
worker stopped and was restarted) and stops it on close.
Choosing a server or the local worker in Admin switches at once (:meth:`use_server`,
:meth:`use_local_worker`). :meth:`start` needs the qasync loop running;
:meth:`shutdown` is a coroutine. From start to shutdown Python's garbage collector runs
on the Qt thread only (:mod:`app.collector`).
"""

import gc
import logging
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject

from app.answer import AnswerStats
from app.client import AnswerResult, WorkerClient
from app.collector import QtThreadCollector
from app.controllers.admin import AdminController
from app.controllers.chat import ChatController
from app.controllers.demo import DemoController
from app.demo import load_prompts
from app.lag import LagMeter
from app.launcher import WorkerCommand, WorkerLauncher
from app.models.answers import RecentAnswersModel
from app.paths import DATABASE_NAME, assets_dir
from app.store import AsyncStore, Store
from app.tasks import TaskSet
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
        self.command = command or WorkerCommand()
        self.attached_by_option = worker_url is not None
        self.launcher: WorkerLauncher | None = None
        self.answers = RecentAnswersModel(parent=self)
        self.chat = ChatController(self.db, self.client, self)
        if worker_url is None:
            self.launcher = self._new_launcher()
        self.demo = DemoController(self.db, self.client, self)
        self.admin = AdminController(self.db, self.client, self)
        prompts = load_prompts(assets_dir() / "demo" / "prompts.json")
        self.window = MainWindow(self.chat, self.demo, self.admin, self.client, self.answers,
                                 prompts)
        self.lag = LagMeter()
        self.collector = QtThreadCollector(self)  # cycles die on the Qt thread only
        self._closed = False
        self._tasks = TaskSet(lambda what, exc: self.window.show_worker_problem(
            f"{what} failed: {exc}"))
        self._wire()

    def _new_launcher(self) -> WorkerLauncher:
        launcher = WorkerLauncher(self.command, self.data_dir / "worker.log", self)
        launcher.listened.connect(self.client.set_url)
        launcher.listened.connect(self.chat.worker_restarted)
        launcher.exited.connect(self._worker_died)
        launcher.gave_up.connect(self.chat.worker_gave_up)
        return launcher

    def _wire(self) -> None:
        self.chat.history_loaded.connect(self.answers.reset)
        self.chat.answer_completed.connect(lambda _id, stats: self._measured(stats))
        self.demo.pane_finished.connect(self._demo_measured)
        self.admin.server_chosen.connect(self._server_chosen)
        if self.launcher is not None:
            self.launcher.gave_up.connect(self.window.show_worker_problem)

    def _server_chosen(self, url: Any, token: Any) -> None:
        if url is None:
            self.use_local_worker()
        else:
            self.use_server(str(url), None if token is None else str(token))

    def use_server(self, url: str, token: str | None) -> None:
        """Attach to a running server (stopping the worker this app started, if any)."""
        if self.launcher is not None:
            self.launcher.stop()
            self.launcher.deleteLater()
            self.launcher = None
        log.info("attaching to %s", url)
        self.client.attach(url, token)

    def use_local_worker(self) -> None:
        """Start (or keep) this app's own worker and talk to it."""
        if self.launcher is not None and self.launcher.url is not None:
            self.client.attach(self.launcher.url, None)
            return
        if self.launcher is None:
            self.launcher = self._new_launcher()
            self.launcher.gave_up.connect(self.window.show_worker_problem)
        log.info("using the local worker")
        self.client.attach(None, None)
        self.launcher.start()

    def _measured(self, stats: AnswerStats) -> None:
        if not stats.estimated and stats.tokens_per_second is not None:
            self.answers.add(stats)

    def _demo_measured(self, side: str, result: AnswerResult) -> None:
        self._measured(result.stats)

    def _worker_died(self, why: str) -> None:
        self.chat.worker_stopped(why)
        self.client.set_url(None, why)

    async def _attach_saved_or_start(self) -> None:
        saved = await self.admin.saved_server()
        if saved is not None:
            self.use_server(*saved)
        elif self.launcher is not None:
            self.launcher.start()

    def start(self) -> None:
        """Show the window and start everything (with the event loop running)."""
        self.window.show()
        self.client.start()
        if self.launcher is not None:
            self._tasks.spawn(self._attach_saved_or_start(), "Choosing the worker")
        self.chat.load()
        self.demo.load()
        self.admin.load()
        self.lag.start()
        self.collector.start()
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
        await self._tasks.wait()
        await self.lag.stop()
        log.info("event-loop lag this session: %s", self.lag.summary())
        if self.launcher is not None:
            self.launcher.stop()
        self.db.close()
        self.collector.stop()
