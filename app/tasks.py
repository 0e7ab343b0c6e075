"""Background coroutines started from Qt slots, tracked so none is lost or silent.

Contract: :meth:`TaskSet.spawn` schedules a coroutine on the running event loop and
keeps a reference until it ends; an exception is logged and handed to ``on_error``
(the controller turns it into a notice), never swallowed. :meth:`TaskSet.wait`
awaits everything still running (used on close and in tests).
"""

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger(__name__)


class TaskSet:
    def __init__(self, on_error: Callable[[str, BaseException], None] | None = None) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        self._on_error = on_error

    def spawn(self, coro: Coroutine[Any, Any, Any], what: str) -> "asyncio.Task[Any]":
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(lambda t: self._done(t, what))
        return task

    def _done(self, task: "asyncio.Task[Any]", what: str) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.error("%s failed", what, exc_info=exc)
            if self._on_error is not None:
                self._on_error(what, exc)

    @property
    def idle(self) -> bool:
        return not self._tasks

    async def wait(self) -> None:
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
