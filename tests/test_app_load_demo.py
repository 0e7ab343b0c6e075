"""The load demo: its plan and arithmetic, what the controller sends (all of a level's
answers at once, cold, plain then speculative), Stop, failures, the page and its chart.

A fake client and a fake clock for the controller and the page (the test ends each
answer, and says what time it is): nothing depends on this machine's speed. Two tests
use the real worker client: against a small in-process server that holds every answer
until the test lets it go (so a level's answers must be in flight together), and
against a closed port (the worker unreachable). Screenshots go to
``ANVE_SCREENSHOT_DIR`` or a temporary folder.
"""

import asyncio
import itertools
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app import theme
from app.answer import AnswerStats
from app.application import AnveApp
from app.client import COMPLETE, ERROR, STOPPED, AnswerRequest, AnswerResult, Health, WorkerClient
from app.controllers.load_demo import LoadDemoController
from app.demo import DemoPrompt
from app.load_demo import (
    FAIRNESS,
    Answer,
    Measured,
    Report,
    Step,
    failure_text,
    headline_text,
    level_text,
    plan,
    progress_text,
    prompts_for,
    ran_text,
    speculation_for,
    speculative_method,
    start_text,
    table_rows,
)
from app.widgets.load_demo_page import SIDE_BY_SIDE, UNDER_LOAD, LoadDemoPage
from engine.protocol import COLD
from tests.app_support import finish, qasync_loop
from tests.foreign_support import free_port, serve

PROMPTS = [DemoPrompt("code", f"Prompt {i}", f"Question {i}?") for i in range(3)]
SETTING = {"enabled": True, "method": "auto", "num_draft_tokens": "adaptive",
           "load_threshold": 2, "available_methods": ["auto", "off", "ngram", "draft"]}


# --- plan and arithmetic ------------------------------------------------------------------


def test_each_level_runs_plain_then_speculative_on_cycling_prompts() -> None:
    assert plan() == [Step(1, False), Step(1, True), Step(2, False), Step(2, True),
                      Step(4, False), Step(4, True)]
    assert prompts_for(4, PROMPTS) == [PROMPTS[0], PROMPTS[1], PROMPTS[2], PROMPTS[0]]
    assert prompts_for(2, PROMPTS) == PROMPTS[:2]
    with pytest.raises(ValueError):
        prompts_for(1, [])
    assert speculation_for(Step(2, False), "draft") == {"method": "off"}
    assert speculation_for(Step(2, True), "draft") == {"method": "draft"}
    assert Step(1, True).describe() == "1 answer at once, speculation on"
    assert progress_text(Step(2, True), 1, 2) == ("2 answers at once, speculation on: "
                                                  "1 of 2 answers done")
    assert progress_text(Step(1, False), 0, 1) == ("1 answer at once, speculation off: "
                                                   "0 of 1 answer done")


def test_speculation_asks_for_the_workers_default_method() -> None:
    assert speculative_method(SETTING) == "auto"
    assert speculative_method({**SETTING, "method": "ngram"}) == "ngram"
    assert speculative_method({**SETTING, "method": "off"}) == "auto"  # off is not a choice
    assert speculative_method({"method": "off", "available_methods": ["off", "ngram"]}) \
        == "ngram"
    assert speculative_method(None) == "draft"  # before the worker said (the demo's too)


def answer(sent: float, done: float, tokens: int, first: float | None = 0.5,
           **kwargs: Any) -> Answer:
    return Answer(sent, done, first, tokens, **{"cache": COLD, **kwargs})


def test_total_speed_is_all_tokens_over_the_wall_time_each_answer_its_own() -> None:
    plain = Measured(Step(2, False), (answer(0.0, 4.0, 40, 0.25), answer(0.5, 10.5, 50, 1.5)))
    assert plain.wall_s == pytest.approx(10.5)  # from the first send to the last end
    assert plain.total_rate == pytest.approx(90 / 10.5)
    assert plain.answer_rates == pytest.approx([10.0, 5.0])  # each from its own send
    assert plain.answer_rate == pytest.approx(7.5)
    assert plain.worst_first_token_s == pytest.approx(1.5)
    fast = Measured(Step(2, True), (answer(0.0, 3.0, 45), answer(0.0, 5.0, 45, None)))
    assert fast.total_rate == pytest.approx(18.0) and fast.worst_first_token_s == 0.5
    report = Report().add(plain).add(fast)
    assert report.ratio(2) == pytest.approx(18.0 / (90 / 10.5))
    assert report.ratio(1) is None and report.levels == [2]
    assert Measured(Step(1, False), (answer(1.0, 1.0, 5),)).total_rate is None
    assert Measured(Step(1, False), (answer(0.0, 2.0, 0, None),)).answer_rates == []
    assert Measured(Step(1, False), ()).wall_s is None


def test_a_level_in_words() -> None:
    plain = Measured(Step(4, False), tuple(answer(0.0, 10.0, 90, 0.35) for _ in range(4)))
    fast = Measured(Step(4, True), tuple(answer(0.0, 8.78, 90, 0.4) for _ in range(4)))
    report = Report((plain, fast))
    assert level_text(report, 4) == (
        "4 answers at once: 41 tok/s total with speculation, 36 without (1.14×); each "
        "answer 10 tok/s (9.0 without); first token within 0.40 s (0.35 s without)")
    assert level_text(Report((plain,)), 4).startswith(
        "4 answers at once: 36 tok/s total without speculation (with speculation: not "
        "measured)")
    assert level_text(Report(), 2) == "2 answers at once: not measured"
    one = Measured(Step(1, True), (answer(0.0, 2.0, 40, 0.3),))
    assert headline_text(Report((plain, fast, one))) == level_text(report, 4)  # the busiest
    assert headline_text(Report((one, plain))) == level_text(Report((plain,)), 4)
    assert headline_text(Report()) == ""
    assert table_rows(Report((one, plain, fast))) == [
        ("1", "– → 20 tok/s", "–", "– → 20 tok/s", "– → 0.30 s"),
        ("2", "–", "–", "–", "–"),
        ("4", "36 → 41 tok/s", "1.14×", "9.0 → 10 tok/s", "0.35 → 0.40 s"),
    ]


def test_what_ran_and_how_the_answers_started_in_words() -> None:
    ran = Measured(Step(1, True), (answer(0, 1, 5, method="draft", enabled=True),))
    assert ran_text(Report((ran,)), "auto") == "Speculative answers ran with draft model."
    busy = Measured(Step(2, True), (answer(0, 1, 5, method="ngram", enabled=True),
                                    answer(0, 1, 5, method="off", disabled_reason="load")))
    assert ran_text(Report((busy,)), "auto") == (
        "Speculative answers ran with n-gram lookup; speculation was off for 1 of 2 of them "
        "(the appliance was busy).")
    assert ran_text(Report(), "auto") == ("With speculation, the demo asks for: auto (the "
                                          "one predicted fastest).")
    assert start_text(Report((ran, busy))) == (FAIRNESS, True)
    warm = Measured(Step(1, False), (answer(0, 1, 5, cache=None),))
    text, fair = start_text(Report((ran, warm)))
    assert not fair and text.startswith("The worker did not confirm a cold start for 1 of 2")
    step = Step(4, True)
    assert failure_text(step, "lost the connection to the worker", lost=True,
                        refused=False).startswith(
        "The worker could not be reached at 4 answers at once, speculation on (lost the")
    assert failure_text(step, "the queue is full", lost=False, refused=True,
                        code="queue_full") == ("The worker refused an answer at 4 answers at "
                                               "once, speculation on: the queue is full "
                                               "[queue_full]")


# --- the controller and the page with a fake client ---------------------------------------


class FakeClient(QObject):
    """The part of :class:`app.client.WorkerClient` the load demo uses. The test ends the
    answers; a cancelled one ends ``stopped`` on the next turn of the loop, as the real
    client's does."""

    answer_progressed = Signal(str, object)
    answer_finished = Signal(str, object)
    speculation_received = Signal(dict)

    def __init__(self) -> None:
        super().__init__()
        self.requests: dict[str, AnswerRequest] = {}
        self.open: list[str] = []  # sent, not ended
        self.most_open = 0
        self.cancelled: list[str] = []
        self._ids = itertools.count(1)

    def ask(self, request: AnswerRequest) -> str:
        rid = f"answer-{next(self._ids)}"
        self.requests[rid] = request
        self.open.append(rid)
        self.most_open = max(self.most_open, len(self.open))
        return rid

    def cancel(self, rid: str) -> None:
        if rid in self.open and rid not in self.cancelled:
            self.cancelled.append(rid)
            asyncio.get_running_loop().call_soon(self._result, rid, STOPPED, 0, None, "stopped")

    def end(self, rid: str, tokens: int, first: float | None = 0.5, outcome: str = COMPLETE,
            message: str = "", code: str = "") -> None:
        self._result(rid, outcome, tokens, first, message, code)

    def _result(self, rid: str, outcome: str, tokens: int, first: float | None, message: str,
                code: str = "") -> None:
        if rid not in self.open:
            return
        self.open.remove(rid)
        asked = (self.requests[rid].speculation or {}).get("method", "draft")
        plain = asked == "off"
        stats = AnswerStats(method="off" if plain else "draft", enabled=not plain,
                            disabled_reason="request" if plain else None,
                            completion_tokens=tokens, cache=COLD)
        timeline = [] if first is None else [(first, "x")]
        self.answer_finished.emit(rid, AnswerResult(outcome, "x", [], stats, timeline, message,
                                                    code=code))


class Clock:
    """The controller's clock: what the test says."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def fake(qapp: QApplication, qtbot: QtBot) -> Iterator[tuple[LoadDemoPage, FakeClient, Clock]]:
    with qasync_loop(qapp):
        client, clock = FakeClient(), Clock()
        controller = LoadDemoController(client, clock=clock)  # type: ignore[arg-type]
        page = LoadDemoPage(controller, PROMPTS)
        qtbot.addWidget(page)
        client.speculation_received.emit(SETTING)
        yield page, client, clock
        controller.cancel()
        finish(qtbot, controller.wait())


def wait_for_step(qtbot: QtBot, page: LoadDemoPage, client: FakeClient, step: Step) -> list[str]:
    """Wait until ``step``'s answers are all sent; their ids, in the order sent."""
    qtbot.waitUntil(lambda: page.controller.step == step and len(client.open) == step.level)
    return list(client.open)


def cells(page: LoadDemoPage, level: int) -> list[str]:
    return [cell.text() for cell in page.cells[level]]


def end_step(client: FakeClient, clock: Clock, ids: list[str], durations: list[float],
             tokens: list[int], firsts: list[float]) -> None:
    """End the answers in order, each ``durations[i]`` after the step's sends."""
    start = clock.now
    for rid, duration, n, first in zip(ids, durations, tokens, firsts, strict=True):
        clock.now = start + duration
        client.end(rid, n, first)


def test_each_level_sends_its_answers_together_and_measures_them(
    fake: tuple[LoadDemoPage, FakeClient, Clock], qtbot: QtBot
) -> None:
    page, client, clock = fake
    controller = page.controller
    assert page.start() and not page.start()  # one run at a time
    assert page.stop_button.isEnabled() and not page.start_button.isEnabled()
    finished: list[Report] = []
    controller.run_finished.connect(finished.append)
    for step in plan():
        ids = wait_for_step(qtbot, page, client, step)
        assert client.most_open == step.level  # all in flight before any ends
        assert page.status.text() == progress_text(step, 0, step.level)
        for rid in ids:
            request = client.requests[rid]
            assert request.cache == COLD and request.temperature == 0.0
            assert request.max_tokens == 128
            assert request.speculation == {"method": "auto" if step.speculative else "off"}
        asked = [client.requests[rid].messages[0]["content"] for rid in ids]
        assert asked == [p.prompt for p in prompts_for(step.level, PROMPTS)]
        client.most_open = 0
        n = step.level
        if n == 4:
            assert cells(page, 1)[1] == "5.0 → 8.0 tok/s"  # earlier levels already shown
            assert page.headline.text().startswith("2 answers at once: 16 tok/s total")
        durations = [5.0] * n if step.speculative else [8.0, 8.0, 10.0, 10.0][:n]
        end_step(client, clock, ids[:1], durations[:1], [40], [0.25 * n])
        assert page.status.text() == progress_text(step, 1, n)
        end_step(client, clock, ids[1:], [d - durations[0] for d in durations[1:]],
                 [40] * (n - 1), [0.25 * n] * (n - 1))
    qtbot.waitUntil(lambda: bool(finished))
    report = finished[0]
    assert isinstance(report, Report) and report.levels == [1, 2, 4]
    four_plain, four_fast = report.get(4, False), report.get(4, True)
    assert four_plain is not None and four_fast is not None
    assert four_plain.total_rate == pytest.approx(160 / 10.0)  # from the first send
    assert four_plain.answer_rates == pytest.approx([5.0, 5.0, 4.0, 4.0])
    assert four_fast.total_rate == pytest.approx(32.0) and report.ratio(4) == 2.0
    assert four_fast.worst_first_token_s == 1.0
    assert report.ratio(1) == pytest.approx(8.0 / 5.0)
    assert not controller.busy and not controller.in_flight
    assert page.status.text().startswith("Done") and page.status.property("kind") == "good"
    assert page.headline.text().startswith(
        "4 answers at once: 32 tok/s total with speculation, 16 without (2.00×)")
    assert cells(page, 4) == ["4", "16 → 32 tok/s", "2.00×", "4.5 → 8.0 tok/s", "1.00 → 1.00 s"]
    assert page.ran.text() == "Speculative answers ran with draft model."
    assert page.start_note.text() == FAIRNESS
    assert page.start_button.isEnabled() and not page.stop_button.isEnabled()


def test_stop_cancels_every_answer_in_flight_and_keeps_the_levels_measured(
    fake: tuple[LoadDemoPage, FakeClient, Clock], qtbot: QtBot
) -> None:
    page, client, clock = fake
    assert page.start()
    for step in plan()[:2]:
        end_step(client, clock, wait_for_step(qtbot, page, client, step), [2.0], [20], [0.3])
    in_flight = wait_for_step(qtbot, page, client, Step(2, False))
    client.end(in_flight[0], 20)  # one of the two has ended
    qtbot.mouseClick(page.stop_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not page.controller.busy)
    assert client.cancelled == in_flight[1:] and not client.open  # nothing is left running
    assert len(client.requests) == 4  # no further step was sent
    assert page.status.text().startswith("Stopped: every answer in flight was cancelled")
    assert page.controller.report.levels == [1]  # the level cut short is not counted
    assert page.headline.text().startswith("1 answer at once: 10 tok/s total with speculation")
    assert cells(page, 2) == ["2", "–", "–", "–", "–"]
    assert page.start_button.isEnabled() and not page.stop_button.isEnabled()
    assert page.start()  # and it can run again, from an empty report
    wait_for_step(qtbot, page, client, Step(1, False))
    assert page.headline.text() == "No level measured yet."
    assert cells(page, 1) == ["1", "–", "–", "–", "–"]


def test_a_refused_answer_stops_the_others_and_says_why(
    fake: tuple[LoadDemoPage, FakeClient, Clock], qtbot: QtBot
) -> None:
    page, client, clock = fake
    assert page.start()
    for step in plan()[:4]:
        ids = wait_for_step(qtbot, page, client, step)
        end_step(client, clock, ids, [1.0] * step.level, [10] * step.level, [0.2] * step.level)
    ids = wait_for_step(qtbot, page, client, Step(4, False))
    client.end(ids[0], 10)
    client.end(ids[1], 0, None, ERROR, "too many requests are waiting", "queue_full")
    qtbot.waitUntil(lambda: not page.controller.busy)
    assert client.cancelled == ids[2:] and not client.open
    assert page.status.text() == ("The worker refused an answer at 4 answers at once, "
                                  "speculation off: too many requests are waiting [queue_full]")
    assert page.status.property("kind") == "bad"
    assert page.controller.report.levels == [1, 2]  # what was measured stays shown
    assert page.headline.text().startswith("2 answers at once: 20 tok/s total")
    assert cells(page, 4)[1:] == ["–"] * 4


def test_the_start_button_says_why_it_waits(fake: tuple[LoadDemoPage, FakeClient, Clock]) -> None:
    page, _client, _clock = fake
    assert page.method.text() == ("Speculation on: the worker's default method, auto (the "
                                  "one predicted fastest).")
    page.set_blocked("Loading the models (40%): converting")
    assert not page.start_button.isEnabled() and not page.start()
    assert page.method.text() == "Loading the models (40%): converting"
    page.set_blocked(None)
    assert page.start_button.isEnabled()


# --- the real worker client -----------------------------------------------------------------


class HeldWorker:
    """``POST /v1/chat/completions`` that holds every answer until :meth:`release`, then
    streams two tokens and our worker's final chunk. Counts answers in flight."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.held: list[asyncio.Future[None]] = []
        self.in_flight = self.most_in_flight = 0
        self._runner: web.AppRunner | None = None

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app)
        return await serve(self._runner)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def release(self) -> None:
        for held in self.held:
            if not held.done():
                held.set_result(None)
        self.held.clear()

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        held = asyncio.get_running_loop().create_future()
        self.held.append(held)
        try:
            await held
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            method = body["speculation"]["method"]
            for text in ("Dear ", "all"):
                await _event(response, {"choices": [{"delta": {"content": text}}],
                                        "anve": {"method": method, "tokens": 1}})
            await _event(response, {
                "choices": [{"delta": {}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 9, "completion_tokens": 2},
                "speculation": {"method": "off" if method == "off" else "draft",
                                "enabled": method != "off", "total_s": 0.1},
                "anve": {"cache": body["anve"]["cache"]}})
            await response.write(b"data: [DONE]\n\n")
            return response
        finally:
            self.in_flight -= 1


async def _event(response: web.StreamResponse, payload: dict[str, Any]) -> None:
    await response.write(b"data: " + json.dumps(payload).encode() + b"\n\n")


def test_the_worker_client_sends_a_levels_answers_together(
    qapp: QApplication, qtbot: QtBot
) -> None:
    with qasync_loop(qapp):
        server = HeldWorker()
        client = WorkerClient(finish(qtbot, server.start()))
        controller = LoadDemoController(client)
        finished: list[Report] = []
        controller.run_finished.connect(finished.append)
        try:
            assert controller.run(PROMPTS, "draft", max_tokens=32)
            sent = 0
            for step in plan():
                sent += step.level

                def arrived(n: int = sent, k: int = step.level) -> bool:
                    return len(server.bodies) == n and len(server.held) == k

                # the server holds them all: they can only be here together
                qtbot.waitUntil(arrived, timeout=10_000)
                assert server.in_flight == step.level
                server.release()
            qtbot.waitUntil(lambda: bool(finished), timeout=10_000)
            assert server.most_in_flight == 4
            assert [b["speculation"]["method"] for b in server.bodies[:4]] == [
                "off", "draft", "off", "off"]
            assert all(b["anve"] == {"cache": "cold"} and b["temperature"] == 0.0
                       for b in server.bodies)
            report = finished[0]
            assert report.levels == [1, 2, 4]
            assert all(m.tokens == 2 * m.step.level and m.total_rate for m in report.measured)
            assert start_text(report) == (FAIRNESS, True)  # the worker confirmed "cold"
        finally:
            controller.cancel()
            finish(qtbot, controller.wait())
            finish(qtbot, client.close())
            finish(qtbot, server.stop())


def test_closing_the_client_mid_run_ends_the_load_demo(qapp: QApplication,
                                                       qtbot: QtBot) -> None:
    """What the app does on close: the client ends every answer, the run ends with them."""
    with qasync_loop(qapp):
        server = HeldWorker()
        client = WorkerClient(finish(qtbot, server.start()))
        controller = LoadDemoController(client)
        stopped: list[Report] = []
        controller.run_stopped.connect(stopped.append)
        try:
            assert controller.run(PROMPTS, "draft", levels=(2,))
            qtbot.waitUntil(lambda: len(server.held) == 2, timeout=10_000)
            finish(qtbot, client.close())
            qtbot.waitUntil(lambda: not controller.busy, timeout=10_000)
            assert stopped == [Report()] and not controller.in_flight
        finally:
            server.release()
            finish(qtbot, controller.wait())
            finish(qtbot, server.stop())


def test_an_unreachable_worker_is_said_clearly(qapp: QApplication, qtbot: QtBot) -> None:
    with qasync_loop(qapp):
        client = WorkerClient(f"http://127.0.0.1:{free_port()}")  # nothing listens there
        controller = LoadDemoController(client)
        page = LoadDemoPage(controller, PROMPTS)
        qtbot.addWidget(page)
        try:
            with qtbot.waitSignal(controller.run_failed, timeout=10_000) as failed:
                assert page.start()
            assert str(failed.args[0]).startswith(
                "The worker could not be reached at 1 answer at once, speculation off")
            qtbot.waitUntil(lambda: not controller.busy)
            assert page.status.text() == failed.args[0]
            assert page.status.property("kind") == "bad"
        finally:
            finish(qtbot, controller.wait())
            finish(qtbot, client.close())


# --- the window ---------------------------------------------------------------------------


@pytest.fixture
def window_app(qapp: QApplication, qtbot: QtBot, tmp_path: Path) -> Iterator[AnveApp]:
    with qasync_loop(qapp):
        theme.apply(qapp, "light")
        anve = AnveApp(tmp_path, worker_url=f"http://127.0.0.1:{free_port()}")  # no worker
        qtbot.addWidget(anve.window)
        anve.window.resize(1320, 820)
        yield anve
        finish(qtbot, anve.shutdown())


def test_the_load_demo_is_the_speed_demos_second_view_and_runs_alone(
    window_app: AnveApp, qtbot: QtBot
) -> None:
    window = window_app.window
    window.show_health(Health("ready", 1.0, "ready", url=window_app.client.url))
    window.show_page("demo")
    views = window.demo_views
    assert views.current == SIDE_BY_SIDE and window.pages.currentWidget() is views
    qtbot.mouseClick(views.buttons[UNDER_LOAD], Qt.MouseButton.LeftButton)
    assert views.current == UNDER_LOAD and views.stack.currentWidget() is window.load_demo_page
    page = window.load_demo_page
    assert page.start()  # nothing listens at the URL: it fails at once
    assert window.chat_page.composer.blocked == ("The load demo is running; it needs the "
                                                 "whole machine.")
    assert window.demo_page.blocked == ("The load demo is running; the side-by-side demo "
                                        "waits for it.")
    qtbot.waitUntil(lambda: not window_app.window.load_demo_controller.busy, timeout=10_000)
    assert window.demo_page.blocked is None and page.blocked is None
    assert window.chat_page.composer.blocked is None
    assert page.status.text().startswith("The worker could not be reached")
    window.show_page("chat")
    window.show_page("demo")
    assert views.current == UNDER_LOAD  # the view chosen stays chosen


def realistic_report() -> Report:
    """What an office CPU might measure (tok/s per answer, first token)."""
    def level(n: int, speculative: bool, each: list[float], first: float) -> Measured:
        answers = tuple(Answer(0.0, 128 / rate, first + 0.05 * i, 128, "draft" if speculative
                               else "off", speculative, None, COLD)
                        for i, rate in enumerate(each))
        return Measured(Step(n, speculative), answers)

    return Report((level(1, False, [11.8], 0.31), level(1, True, [27.4], 0.33),
                   level(2, False, [10.6, 10.2], 0.52), level(2, True, [19.8, 18.1], 0.55),
                   level(4, False, [8.9, 8.6, 8.4, 8.1], 0.9),
                   level(4, True, [10.9, 10.4, 10.1, 9.6], 0.95)))


@pytest.fixture
def shots_dir(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("ANVE_SCREENSHOT_DIR") or tmp_path / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def test_screenshots_of_the_load_demo_light_and_dark(
    window_app: AnveApp, qapp: QApplication, qtbot: QtBot, shots_dir: Path
) -> None:
    window = window_app.window
    window.show()
    window.show_health(Health("ready", 1.0, "ready", url=window_app.client.url))
    window.panel.show_setting(SETTING)
    window.load_demo_page.show_setting(SETTING)
    window.show_page("demo")
    window.demo_views.show_view(UNDER_LOAD)
    report = realistic_report()
    shots = []
    for scheme in ("light", "dark"):
        theme.apply(qapp, scheme)
        window.refresh_theme()
        window.load_demo_controller.run_finished.emit(report)
        qtbot.wait(100)
        assert window.width() == 1320  # the page fits the window's usual size
        shots.append(save(window.grab(), shots_dir / f"load-demo-{scheme}.png"))
    theme.apply(qapp, "light")
    print(f"\nscreenshots saved in {shots_dir}")
    assert all(path.stat().st_size > 10_000 for path in shots)


def test_screenshot_of_the_load_demo_running(
    fake: tuple[LoadDemoPage, FakeClient, Clock], qapp: QApplication, qtbot: QtBot,
    shots_dir: Path,
) -> None:
    theme.apply(qapp, "light")
    report = realistic_report()
    page, client, clock = fake  # mid-run: 4 answers at once, speculation on, 1 done
    page.resize(900, 720)
    page.show()
    assert page.start()
    for step in plan()[:5]:
        ids = wait_for_step(qtbot, page, client, step)
        m = report.get(step.level, step.speculative)
        assert m is not None
        end_step(client, clock, ids, sorted(a.done_s for a in m.answers),
                 [128] * step.level, [a.first_token_s or 0.0 for a in m.answers])
    ids = wait_for_step(qtbot, page, client, Step(4, True))
    client.end(ids[0], 128)
    qtbot.wait(100)
    shot = save(page.grab(), shots_dir / "load-demo-running.png")
    print(f"\nscreenshot saved in {shots_dir}")
    assert shot.stat().st_size > 10_000


def save(pixmap: object, path: Path) -> Path:
    assert pixmap.save(str(path))  # type: ignore[attr-defined]
    return path

