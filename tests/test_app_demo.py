"""The fair speed demo: what the controller asks the worker, the ratios' arithmetic, and
what the page says about them. A fake client: no worker, no network, no clock."""

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app.answer import AnswerStats
from app.client import COMPLETE, AnswerRequest, AnswerResult
from app.controllers.demo import PLAIN, SPECULATIVE, DemoController
from app.demo import (
    Timing,
    method_text,
    speed_text,
    speedups,
    start_text,
    timing,
)
from app.models.demo_runs import summary
from app.store import AsyncStore, DemoRun, Store
from app.widgets.demo_page import DemoPage
from engine.protocol import COLD
from tests.app_support import finish, qasync_loop


class FakeClient(QObject):
    """The part of :class:`app.client.WorkerClient` the demo uses; the test ends answers."""

    answer_progressed = Signal(str, object)
    answer_finished = Signal(str, object)
    speculation_received = Signal(dict)

    def __init__(self) -> None:
        super().__init__()
        self.requests: dict[str, AnswerRequest] = {}
        self._ids = itertools.count(1)

    def ask(self, request: AnswerRequest) -> str:
        rid = f"answer-{next(self._ids)}"
        self.requests[rid] = request
        return rid

    def cancel(self, rid: str) -> None:
        del rid

    def end(self, rid: str, text: str, stats: AnswerStats) -> None:
        self.answer_finished.emit(rid, AnswerResult(COMPLETE, text, [[text, False]], stats,
                                                    [(stats.total_s or 0.0, text)]))


def side(stats: AnswerStats, text: str = "a b c") -> dict[str, Any]:
    return {"text": text, "stats": stats.to_dict(), "timeline": [[stats.total_s, text]]}


PLAIN_STATS = AnswerStats(method="off", completion_tokens=11, time_to_first_token_s=0.5,
                          total_s=2.5, prompt_tokens=40, cache=COLD, token_ids=tuple(range(11)))
FAST_STATS = AnswerStats(method="draft", enabled=True, completion_tokens=11,
                         time_to_first_token_s=0.5, total_s=1.5, prompt_tokens=40, cache=COLD,
                         token_ids=tuple(range(11)))


@pytest.fixture
def demo(qapp: QApplication, qtbot: QtBot) -> Iterator[tuple[DemoController, FakeClient]]:
    with qasync_loop(qapp):
        db = AsyncStore(Store.memory())
        client = FakeClient()
        controller = DemoController(db, client)  # type: ignore[arg-type]
        yield controller, client
        finish(qtbot, controller.wait())
        db.close()


def test_both_runs_ask_for_a_cold_start_plain_first(
    demo: tuple[DemoController, FakeClient], qtbot: QtBot
) -> None:
    controller, client = demo
    assert controller.run("  Plan a lunch  ", "draft", max_tokens=64)
    qtbot.waitUntil(lambda: len(client.requests) == 1)
    (plain_id, plain), = client.requests.items()
    assert plain.speculation == {"method": "off"} and plain.cache == COLD
    assert plain.temperature == 0.0 and plain.max_tokens == 64
    assert plain.messages == [{"role": "user", "content": "Plan a lunch"}]
    assert plain.body()["anve"] == {"cache": "cold"}
    client.end(plain_id, "a b c", PLAIN_STATS)
    qtbot.waitUntil(lambda: len(client.requests) == 2)  # only after the plain run ended
    fast_id, fast = list(client.requests.items())[1]
    assert fast.speculation == {"method": "draft"} and fast.cache == COLD
    assert fast.messages == plain.messages and fast.temperature == 0.0
    with qtbot.waitSignal(controller.run_finished) as finished:
        client.end(fast_id, "a b c", FAST_STATS)
    run = finished.args[0]
    assert isinstance(run, DemoRun) and run.identical
    assert run.speedup == pytest.approx(2.5 / 1.5)  # end to end, from the worker's times
    assert run.plain["stats"]["cache"] == run.speculative["stats"]["cache"] == COLD
    assert not controller.busy


def test_ratios_end_to_end_and_after_the_first_token() -> None:
    plain, fast = Timing(11, 0.5, 2.5), Timing(11, 0.5, 1.5)
    assert plain.rate == pytest.approx(11 / 2.5)
    assert plain.rate_after_first == pytest.approx(10 / 2.0)
    ratios = speedups(plain, fast)
    assert ratios.total == pytest.approx(2.5 / 1.5)  # same tokens: the ratio of times
    assert ratios.after_first == pytest.approx(2.0 / 1.0)
    slow_start = Timing(11, 1.5, 2.5)  # the case: a faster start inflates the total
    assert speedups(slow_start, fast).total == pytest.approx(2.5 / 1.5)
    assert speedups(slow_start, fast).after_first == pytest.approx(1.0)
    longer = speedups(Timing(10, 0.0, 2.0), Timing(20, 0.0, 2.0))  # rates when lengths differ
    assert longer.total == pytest.approx(2.0)
    assert speedups(Timing(1, 0.5, 0.5), Timing(1, 0.4, 0.4)).after_first is None
    assert speedups(Timing(0, None, None), fast) == speedups(plain, Timing(3, None, None)) \
        == type(ratios)(None, None)


def test_timing_prefers_the_workers_times_else_the_timeline() -> None:
    assert timing(FAST_STATS, [[9.0, "x"]]) == Timing(11, 0.5, 1.5)
    old = AnswerStats(completion_tokens=3, time_to_first_token_s=0.2)  # saved before total_s
    assert timing(old, [[0.3, "a "], [0.9, "b c"]]) == Timing(3, 0.3, 0.9)
    assert timing(old) == Timing(3, None, None)


def test_the_page_words_say_what_ran_and_how_it_started() -> None:
    text = speed_text(Timing(11, 0.68, 2.5), Timing(11, 0.71, 1.5))
    assert text == ("2.30× after the first token · first token 0.68 s plain, "
                    "0.71 s speculative")
    assert method_text(FAST_STATS, "hybrid") == "Method: draft model"
    busy = AnswerStats(method="off", enabled=False, disabled_reason="load")
    assert "off for this run (the appliance was busy)" in method_text(busy, "draft")
    assert method_text(AnswerStats(), "draft") == "Method asked for: draft model"
    cold, fair = start_text(PLAIN_STATS, FAST_STATS)
    assert fair and cold.startswith("Both runs started cold")
    assert "did not draft from the plain run's answer" in cold
    lookup = AnswerStats(method="suffix", enabled=True, cache=COLD)
    assert "earlier answers only" in start_text(PLAIN_STATS, lookup)[0]
    warm = AnswerStats(method="draft", enabled=True, prompt_tokens=40, cached_tokens=39)
    unfair, fair = start_text(AnswerStats(prompt_tokens=40), warm)
    assert not fair and unfair.startswith("Not a like-for-like start: 39 prompt tokens")
    same, fair = start_text(AnswerStats(), AnswerStats(method="draft", enabled=True))
    assert fair and same == "Both runs found the same 0 prompt tokens cached."
    assert not start_text(AnswerStats(), AnswerStats(method="hybrid", enabled=True))[1]


@pytest.fixture
def page(qtbot: QtBot) -> Iterator[DemoPage]:
    db = AsyncStore(Store.memory())
    shown = DemoPage(DemoController(db, FakeClient()), [])  # type: ignore[arg-type]
    qtbot.addWidget(shown)
    yield shown
    db.close()


def test_the_page_shows_both_ratios_first_tokens_method_and_start(page: DemoPage) -> None:
    run = DemoRun(1, 0.0, "p", "hybrid", side(PLAIN_STATS), side(FAST_STATS), True, None,
                  9.9)  # the stored figure is not what the page shows: it recomputes
    page.show_run(run)
    assert page.speedup.text() == "1.67× faster" and page.speedup_note.text() == "end to end"
    assert page.details.text() == ("2.00× after the first token · first token 0.50 s plain, "
                                   "0.50 s speculative · Method: draft model")
    assert page.panes[SPECULATIVE].title.text() == "Speculative: draft model"  # what ran
    assert page.start_note.text().startswith("Both runs started cold")
    assert page.start_note.property("kind") == ""
    assert "1.67× faster" in summary(run)


def test_the_page_warns_when_the_runs_did_not_start_alike(page: DemoPage) -> None:
    warm = AnswerStats(method="draft", enabled=True, completion_tokens=11, prompt_tokens=40,
                       cached_tokens=39, time_to_first_token_s=0.03, total_s=1.5)
    plain = AnswerStats(method="off", completion_tokens=11, prompt_tokens=40,
                        time_to_first_token_s=0.68, total_s=2.1)
    page.show_run(DemoRun(2, 0.0, "p", "draft", side(plain), side(warm), True, None, 1.4))
    assert page.start_note.text().startswith("Not a like-for-like start")
    assert page.start_note.property("kind") == "bad"
    assert page.speedup.text() == "1.40× faster"
    assert page.panes[PLAIN].footer.text().startswith("11 tokens")
