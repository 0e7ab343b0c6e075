"""The main window: sidebar, the page in view (chat, demo, admin), the speculation panel.

Contract: the window only arranges the views and routes what they show: the worker's
health to the banner, the composer and the demos (why input is blocked), answers' live
and final numbers to the panel. The sidebar's speed demo entry holds two views
(:class:`DemoViews`): the side-by-side demo and the load demo; only one of the chat and
the two demos runs at a time. Without a ``load_demo`` controller the window makes one
on ``client``. Closing it emits :attr:`MainWindow.closed`; the app then shuts down (the
window itself stops nothing: closing the client ends every answer, the load demo's too).

Keyboard shortcuts (window-wide actions, named in the tooltips): Ctrl+N starts a new
chat, Ctrl+F and Ctrl+K search all messages; the sidebar adds F2 (rename) and Delete.
"""

from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QAction, QCloseEvent, QKeySequence
from PySide6.QtWidgets import QHBoxLayout, QMainWindow, QStackedWidget, QVBoxLayout, QWidget

from app.answer import AnswerStats
from app.client import Health, WorkerClient
from app.controllers.admin import AdminController
from app.controllers.chat import ChatController
from app.controllers.demo import DemoController
from app.controllers.load_demo import LoadDemoController
from app.demo import DemoPrompt
from app.models.answers import RecentAnswersModel
from app.widgets.admin_page import AdminPage
from app.widgets.chat_page import ChatPage
from app.widgets.demo_page import DemoPage
from app.widgets.icons import icon, refresh_icons
from app.widgets.load_demo_page import DemoViews, LoadDemoPage
from app.widgets.sidebar import Sidebar
from app.widgets.speculation_panel import SpeculationPanel
from app.widgets.worker_banner import WorkerBanner

PAGE_INDEX = {"chat": 0, "demo": 1, "admin": 2}
NEW_CHAT_KEYS = ("Ctrl+N",)
SEARCH_KEYS = ("Ctrl+F", "Ctrl+K")


class MainWindow(QMainWindow):
    closed = Signal()
    """The user closed the window."""

    def __init__(
        self, chat: ChatController, demo: DemoController, admin: AdminController,
        client: WorkerClient, answers: RecentAnswersModel, prompts: list[DemoPrompt],
        load_demo: LoadDemoController | None = None,
    ) -> None:
        super().__init__()
        self.setWindowTitle("ANVE")
        self.setWindowIcon(icon("anve", size=64))
        self.resize(1320, 820)
        self.chat, self.demo_controller = chat, demo
        self.load_demo_controller = load_demo or LoadDemoController(client, self)
        self.health = Health("starting")
        self.sidebar = Sidebar(chat)
        self.chat_page = ChatPage(chat)
        self.demo_page = DemoPage(demo, prompts)
        self.load_demo_page = LoadDemoPage(self.load_demo_controller, prompts)
        self.demo_views = DemoViews(self.demo_page, self.load_demo_page)
        self.admin_page = AdminPage(admin)
        self.banner = WorkerBanner()
        self.panel = SpeculationPanel(answers)
        self.pages = QStackedWidget()
        for page in (self.chat_page, self.demo_views, self.admin_page):
            self.pages.addWidget(page)
        self.setCentralWidget(self._arrange())
        self.new_chat_action = self._action("New chat", NEW_CHAT_KEYS, self.new_chat)
        self.search_action = self._action("Search all messages", SEARCH_KEYS, self.search)
        self._connect(chat, demo, client)
        self.show_health(self.health)

    def _arrange(self) -> QWidget:
        """Sidebar | banner over the page | panel."""
        centre = QWidget()
        column = QVBoxLayout(centre)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(0)
        column.addWidget(self.banner)
        column.addWidget(self.pages, 1)
        root = QWidget()
        row = QHBoxLayout(root)
        row.setContentsMargins(0, 0, 0, 0)
        row.setSpacing(0)
        row.addWidget(self.sidebar)
        row.addWidget(centre, 1)
        row.addWidget(self.panel)
        return root

    def _action(self, text: str, keys: tuple[str, ...], slot: Any) -> QAction:
        action = QAction(text, self)
        action.setShortcuts([QKeySequence(k) for k in keys])
        action.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
        action.triggered.connect(slot)
        self.addAction(action)
        return action

    def new_chat(self) -> None:
        """Start a new conversation and put the cursor in the question box (Ctrl+N)."""
        self.sidebar.new_chat()
        self.chat_page.composer.input.setFocus(Qt.FocusReason.ShortcutFocusReason)

    def search(self) -> None:
        """Put the cursor in the sidebar's search box (Ctrl+F, Ctrl+K)."""
        self.sidebar.focus_search()

    def _connect(self, chat: ChatController, demo: DemoController, client: WorkerClient) -> None:
        self.sidebar.page_selected.connect(self.show_page)
        client.health_changed.connect(self.show_health)
        client.speculation_received.connect(self.panel.show_setting)
        chat.busy_changed.connect(self._gate)
        chat.answer_progressed.connect(self.panel.show_live)
        chat.answer_completed.connect(lambda _id, stats: self.panel.show_final(stats))
        chat.busy_changed.connect(self._chat_busy)
        demo.busy_changed.connect(self._gate)
        demo.pane_updated.connect(lambda _side, progress: self.panel.show_live(progress.stats))
        demo.pane_finished.connect(self._demo_side_finished)
        self.load_demo_controller.busy_changed.connect(self._gate)

    def show_page(self, key: str) -> None:
        self.pages.setCurrentIndex(PAGE_INDEX[key])
        self.sidebar.show_page(key)

    def show_health(self, health: Health) -> None:
        self.health = health
        self.banner.show_health(health)
        self.panel.show_health(health)
        self.admin_page.show_health(health)
        self._gate()

    def show_worker_problem(self, text: str) -> None:
        self.banner.show_problem(text)

    def _gate(self, *_: Any) -> None:
        """Say why questions or demo runs cannot start now (None when they can)."""
        reason = self.health.blocked_reason()
        loading = self.load_demo_controller.busy
        chat_reason = reason or ("The speed demo is running; it needs the whole machine."
                                 if self.demo_controller.busy else None)
        chat_reason = chat_reason or ("The load demo is running; it needs the whole machine."
                                      if loading else None)
        demo_reason = reason or ("An answer is being written in the chat; the demo waits for "
                                 "it." if self.chat.busy else None)
        load_reason = demo_reason or ("The side-by-side demo is running; the load demo waits "
                                      "for it." if self.demo_controller.busy else None)
        demo_reason = demo_reason or ("The load demo is running; the side-by-side demo waits "
                                      "for it." if loading else None)
        engine = self.health.engine
        if engine is not None and engine.foreign:
            demo_reason = (f"The speed demo switches ANVE's speculation off and on for one "
                           f"prompt; {engine.name} sets its speculation when it is started, "
                           "so the demo needs an ANVE worker.")
            load_reason = (f"The load demo switches ANVE's speculation off and on per answer; "
                           f"{engine.name} sets its speculation when it is started, so the "
                           "demo needs an ANVE worker.")
        self.chat_page.set_blocked(chat_reason)
        self.demo_page.set_blocked(demo_reason)
        self.load_demo_page.set_blocked(load_reason)

    def _chat_busy(self, busy: bool) -> None:
        if busy:
            self.panel.begin_answer()

    def _demo_side_finished(self, side: str, result: Any) -> None:
        if isinstance(result.stats, AnswerStats):
            self.panel.show_final(result.stats)

    def refresh_theme(self) -> None:
        refresh_icons(self)
        self.chat_page.view.refresh()
        self.panel.refresh_theme()
        self.update()

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802
        self.closed.emit()
        event.accept()
