"""Helpers for the desktop app's tests: a qasync loop inside pytest-qt, waiting on coroutines.

``qasync_loop`` makes a qasync ``QEventLoop`` the running asyncio loop while the test
body runs, so ``qtbot.waitSignal`` / ``waitUntil`` (nested Qt event loops) also run
the app's coroutines and aiohttp sockets. ``finish`` waits for a coroutine that way.
:class:`FakeWorker` streams a long Markdown answer much faster than any real model,
to measure how the window copes.
"""

import asyncio
import contextlib
import json
import subprocess
import sys
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import qasync
from aiohttp import web
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app.application import AnveApp
from tests.worker_process import REPO


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


def open_app(qtbot: QtBot, data: Path, **kwargs: Any) -> AnveApp:
    """Open the app's window on ``data`` (closed with the test) and start it."""
    anve = AnveApp(data, **kwargs)
    qtbot.addWidget(anve.window)
    anve.start()
    return anve


def finish(qtbot: QtBot, coro: Coroutine[Any, Any, Any], timeout_ms: int = 30000) -> Any:
    """Run ``coro`` on the qasync loop until it is done; return its result."""
    task = asyncio.ensure_future(coro)
    qtbot.waitUntil(task.done, timeout=timeout_ms)
    return task.result()


# --- a fast fake worker -------------------------------------------------------------------

LONG_ANSWER_PARAGRAPH = (
    "Speculative decoding lets a small draft model propose the next few tokens, and the "
    "large model checks them all in one forward pass. Accepted tokens cost almost nothing; "
    "the first rejected one is replaced by the large model's own choice.\n\n"
    "```python\ndef accept(p: float, q: float, u: float) -> bool:\n"
    "    return u < min(1.0, p / q)\n```\n\n"
    "- **Lossless**: the output distribution is the large model's.\n"
    "- *Faster*: several tokens per pass when drafts are good.\n\n"
)


class FakeWorker:
    """An OpenAI-style streaming server in a child process, much faster than a real model.

    It answers every chat request with ``chars`` characters of Markdown in chunks of
    ``chunk`` characters every ``interval`` seconds, with ``anve`` pieces and token
    counts, then a final chunk with usage and speculation stats. A child process, so
    that serving does not compete with the app for the GIL.
    """

    def __init__(self, chars: int = 24000, chunk: int = 16, interval: float = 0.004) -> None:
        self.chars, self.chunk, self.interval = chars, chunk, interval
        self.url = ""
        self._proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> "FakeWorker":
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tests.app_support", str(self.chars), str(self.chunk),
             str(self.interval)], stdout=subprocess.PIPE, text=True, cwd=REPO,
        )
        assert self._proc.stdout is not None
        self.url = self._proc.stdout.readline().strip()
        assert self.url.startswith("http://"), self.url
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(10)

    def serve(self) -> None:
        """Run the server here (in the child) and print its URL."""
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/speculation", self._setting)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)

        async def main() -> None:
            runner = web.AppRunner(app)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            print(f"http://127.0.0.1:{runner.addresses[0][1]}", flush=True)
            await asyncio.Event().wait()

        asyncio.run(main())

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ready", "progress": 1.0, "message": "ready",
                                  "speculation_load_off": False, "models": ["fake"]})

    async def _setting(self, request: web.Request) -> web.Response:
        return web.json_response({"enabled": True, "method": "draft", "num_draft_tokens": 4,
                                  "load_threshold": 2, "available_methods": ["off", "draft"]})

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": []})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        text = (LONG_ANSWER_PARAGRAPH * (self.chars // len(LONG_ANSWER_PARAGRAPH) + 1))
        for i, start in enumerate(range(0, self.chars, self.chunk)):
            piece = text[start : start + self.chunk]
            await _event(response, {"choices": [{"delta": {"content": piece}}],
                                    "anve": {"pieces": [[piece, i % 3 != 0]], "tokens": 4}})
            await asyncio.sleep(self.interval)
        passes = self.chars // self.chunk + 1
        await _event(response, {
            "choices": [{"delta": {}, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": passes * 4},
            "speculation": {"method": "draft", "enabled": True, "passes": passes,
                            "drafted": passes * 4, "accepted": passes * 3,
                            "acceptance_rate": 0.75, "mean_accepted_length": 4.0,
                            "accepted_per_position": [passes, passes, passes // 2],
                            "tokens_per_second": 1000.0, "time_to_first_token_s": 0.01},
        })
        await response.write(b"data: [DONE]\n\n")
        return response


async def _event(response: web.StreamResponse, payload: dict[str, Any]) -> None:
    await response.write(b"data: " + json.dumps(payload).encode() + b"\n\n")


if __name__ == "__main__":
    FakeWorker(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])).serve()
