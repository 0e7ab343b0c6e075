"""Helpers for the desktop app's tests: a qasync loop inside pytest-qt, waiting on coroutines.

``qasync_loop`` makes a qasync ``QEventLoop`` the running asyncio loop while the test
body runs, so ``qtbot.waitSignal`` / ``waitUntil`` (nested Qt event loops) also run
the app's coroutines and aiohttp sockets. ``finish`` waits for a coroutine that way.
"""

import asyncio
import contextlib
from collections.abc import Coroutine, Iterator
from typing import Any

import qasync
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot


@contextlib.contextmanager
def qasync_loop(qapp: QApplication) -> Iterator[qasync.QEventLoop]:
    loop = qasync.QEventLoop(qapp, already_running=True)
    asyncio.set_event_loop(loop)
    try:
        yield loop
    finally:
        asyncio.events._set_running_loop(None)
        loop._QEventLoop__is_running = False  # type: ignore[attr-defined]
        qapp.aboutToQuit.disconnect(loop._after_run_forever)
        loop.close()
        asyncio.set_event_loop(None)


def finish(qtbot: QtBot, coro: Coroutine[Any, Any, Any], timeout_ms: int = 30000) -> Any:
    """Run ``coro`` on the qasync loop until it is done; return its result."""
    task = asyncio.ensure_future(coro)
    qtbot.waitUntil(task.done, timeout=timeout_ms)
    return task.result()
