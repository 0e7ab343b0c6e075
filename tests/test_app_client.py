"""The app's worker client against a small in-process server: answers that arrive out of order."""

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import qasync
from aiohttp import web
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app.client import WorkerClient
from tests.app_support import finish, qasync_loop
from tests.foreign_support import serve


@pytest.fixture
def loop(qapp: QApplication) -> Iterator[qasync.QEventLoop]:
    with qasync_loop(qapp) as event_loop:
        yield event_loop


class SlowStatus:
    """``/v1/heads/learning``: a ``GET`` answered late with the old state, a ``POST`` at once."""

    def __init__(self) -> None:
        self.state, self.gets_answered = "idle", 0
        self.release = asyncio.Event()
        self._runner: web.AppRunner | None = None

    async def start(self) -> str:
        app = web.Application()
        app.router.add_get("/v1/heads/learning", self._get)
        app.router.add_post("/v1/heads/learning", self._post)
        self._runner = web.AppRunner(app)
        return await serve(self._runner)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _get(self, _request: web.Request) -> web.Response:
        state = self.state  # read on arrival, answered after the POST's answer
        await self.release.wait()
        self.gets_answered += 1
        return web.json_response({"state": state})

    async def _post(self, _request: web.Request) -> web.Response:
        self.state = "running"
        return web.json_response({"state": "running"}, status=202)


def test_a_slow_status_read_does_not_undo_the_later_start_it_was_overtaken_by(
    loop: qasync.QEventLoop, qtbot: QtBot
) -> None:
    server = SlowStatus()
    client = WorkerClient(finish(qtbot, server.start()), admin_token="secret")
    seen: list[dict[str, Any]] = []
    client.learning_received.connect(seen.append)
    try:
        client.fetch_learning()
        qtbot.wait(100)  # the GET is at the server, waiting
        client.start_learning([[{"role": "user", "content": "hi"}]])
        qtbot.waitUntil(lambda: seen == [{"state": "running"}], timeout=10_000)
        server.release.set()
        qtbot.waitUntil(lambda: server.gets_answered == 1, timeout=10_000)
        qtbot.waitUntil(lambda: not client._tasks, timeout=10_000)
        assert seen == [{"state": "running"}]  # the stale "idle" was dropped
        client.fetch_learning()  # a read sent after the start is applied as usual
        server.release.set()
        qtbot.waitUntil(lambda: len(seen) == 2, timeout=10_000)
        assert seen[-1] == {"state": "running"}
    finally:
        finish(qtbot, client.close())
        finish(qtbot, server.stop())
