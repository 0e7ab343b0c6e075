"""The app's worker client against a small in-process server: answers that arrive out of
order, a stream that breaks off, the request fields of a continued answer."""

import asyncio
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import qasync
from aiohttp import web
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app.client import (
    INTERRUPTED,
    AnswerRequest,
    AnswerResult,
    WorkerClient,
    describe_batch,
    describe_kernels,
    describe_plan,
)
from tests.app_support import finish, qasync_loop
from tests.foreign_support import serve


@pytest.fixture
def loop(qapp: QApplication) -> Iterator[qasync.QEventLoop]:
    with qasync_loop(qapp) as event_loop:
        yield event_loop


class SlowStatus:
    """``/v1/heads/learning``: a ``GET`` answered late with the old state, a ``POST`` at once."""

    def __init__(self) -> None:
        self.state, self.gets_arrived, self.gets_answered = "idle", 0, 0
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
        self.gets_arrived += 1
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
        qtbot.waitUntil(lambda: server.gets_arrived == 1, timeout=10_000)  # and waits there
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


class BreakingWorker:
    """``POST /v1/chat/completions``: one chunk of text, then the connection drops (as when
    the worker process is killed mid-answer). Keeps the request bodies."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self._runner: web.AppRunner | None = None

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app)
        return await serve(self._runner)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        self.bodies.append(await request.json())
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        chunk = {"choices": [{"delta": {"content": "Dear all,"}}], "anve": {"method": "ngram"}}
        await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        assert request.transport is not None
        request.transport.close()  # no final chunk, no end of the chunked body
        return response


def test_a_stream_that_breaks_off_keeps_its_text_and_says_so_in_words(
    loop: qasync.QEventLoop, qtbot: QtBot, caplog: pytest.LogCaptureFixture
) -> None:
    server = BreakingWorker()
    client = WorkerClient(finish(qtbot, server.start()))
    partial = [{"role": "user", "content": "Write a memo"},
               {"role": "assistant", "content": "Memo:"}]
    try:
        with caplog.at_level(logging.WARNING, logger="app.client"), \
                qtbot.waitSignal(client.answer_finished, timeout=10_000) as ended:
            client.ask(AnswerRequest(partial, 0.0, 64, continue_answer=True,
                                     context_overflow="rolling_window"))
        result = ended.args[1]
        assert isinstance(result, AnswerResult)
        assert (result.outcome, result.text, result.connection_lost) == (
            INTERRUPTED, "Dear all,", True)
        assert result.message == "lost the connection to the worker"  # no exception text
        assert "connection to the worker broke" in caplog.text  # the detail is in the log
        body = server.bodies[0]
        assert (body["continue_final_message"], body["add_generation_prompt"]) == (True, False)
        assert body["anve"] == {"context_overflow": "rolling_window"}
        assert body["messages"][-1] == {"role": "assistant", "content": "Memo:"}
    finally:
        finish(qtbot, client.close())
        finish(qtbot, server.stop())


def test_the_kernels_a_worker_runs_read_as_words() -> None:
    assert describe_kernels({"variant": "avx512", "rows_per_pass": 16, "forced": False}) == (
        "avx512, 16 rows a pass (the best this CPU runs)")
    assert describe_kernels({"variant": "avx2", "rows_per_pass": 8, "forced": True}) == (
        "avx2, 8 rows a pass (forced)")
    assert describe_kernels({"variant": None, "rows_per_pass": 0}).startswith("torch's")
    assert describe_kernels(None) == "" and describe_kernels("avx2") == ""


def test_a_forward_plan_reads_as_words() -> None:
    native = {"backend": "native", "variant": "avx512", "formats": {"q6k": 56, "q4k": 140},
              "output": "q6k", "attention": "native rows (C), in the same call",
              "tree_rows": 16, "read_rows": 64, "why_reference": None}
    assert describe_plan(native) == (
        "native kernels (avx512): 140 q4k, 56 q6k layers, output q6k; attention native rows "
        "(C), in the same call; 16 rows a verification, 64 a prompt read")
    reference = {"backend": "reference", "formats": {"dense": 14}, "output": "dense",
                 "attention": "torch sdpa, one call per row",
                 "why_reference": "the native kernels do not run here"}
    assert describe_plan(reference).startswith(
        "torch reference (the native kernels do not run here): 14 dense layers")
    assert describe_plan(None) == "" and describe_plan([1]) == ""


def test_answers_decoding_together_read_as_words() -> None:
    busy = {"slots": 4, "running": 2, "last_pass_answers": 2, "tokens_per_second": 31.04,
            "answer_tokens_per_second": 14.2}
    assert describe_batch(busy) == (
        "up to 4 answers together; 2 in the last pass; 31.0 tok/s in total, 14.2 per answer")
    idle = {"slots": 1, "running": 0, "last_pass_answers": 0, "tokens_per_second": 0.0,
            "answer_tokens_per_second": None}
    assert describe_batch(idle) == "one answer at a time"
    assert describe_batch(None) == "" and describe_batch({"slots": "4"}) == ""
