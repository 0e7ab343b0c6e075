"""Views without a worker: keys, Markdown rendering, following the model, popover, panel,
the Continue action and the window's shortcuts."""

from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app import theme
from app.answer import AnswerStats
from app.application import AnveApp
from app.client import Health, WorkerClient
from app.controllers.demo import DemoController
from app.models.answers import RecentAnswersModel
from app.models.messages import MessageListModel
from app.paths import DATABASE_NAME
from app.store import COMPLETE, AsyncStore, ChatSettings, DemoRun, Message, Store
from app.widgets.admin_page import describe_learning
from app.widgets.composer import Composer
from app.widgets.demo_page import DemoPage
from app.widgets.message_view import ChatView, CodeBlock, MarkdownBody, TextBlock
from app.widgets.settings_popover import SettingsPopover
from app.widgets.speculation_panel import SpeculationPanel
from engine.protocol import STOP_AT_LIMIT
from tests.app_support import finish, qasync_loop

CODE_ANSWER = "Try this:\n\n```python\nprint('hi')\n```\n\nDone."


@pytest.fixture(autouse=True)
def light(qapp: QApplication) -> None:
    theme.apply(qapp, "light")


def test_enter_sends_and_shift_enter_adds_a_line(qtbot: QtBot) -> None:
    composer = Composer()
    qtbot.addWidget(composer)
    composer.set_text("first line")
    qtbot.keyClick(composer.input, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    assert composer.text() == "first line\n"
    composer.input.insertPlainText("second line")
    with qtbot.waitSignal(composer.send_requested) as sent:
        qtbot.keyClick(composer.input, Qt.Key.Key_Return)
    assert sent.args == ["first line\nsecond line"] and composer.text() == ""


def test_blocked_and_busy_composer(qtbot: QtBot) -> None:
    composer = Composer()
    qtbot.addWidget(composer)
    composer.set_blocked("Loading the models (40%): converting")
    assert not composer.input.isEnabled() and not composer.button.isEnabled()
    assert composer.hint.text().startswith("Loading the models")
    composer.set_blocked(None)
    composer.set_busy(True)
    assert composer.button.text().strip() == "Stop"
    with qtbot.waitSignal(composer.stop_requested):
        composer.button.click()
    composer.set_text("not while answering")
    with qtbot.assertNotEmitted(composer.send_requested):
        composer.submit()


def test_markdown_body_boxes_code_and_streams_in_place(qtbot: QtBot) -> None:
    body = MarkdownBody()
    qtbot.addWidget(body)
    body.show_text(CODE_ANSWER[:30], [], False)
    code = body._widgets[1]
    assert isinstance(code, CodeBlock) and code.code.toPlainText() == "print('hi"
    body.show_text(CODE_ANSWER, [], False)
    assert body._widgets[1] is code  # the growing block was updated, not rebuilt
    assert [type(w) for w in body._widgets] == [TextBlock, CodeBlock, TextBlock]
    code.copy.click()
    assert QGuiApplication.clipboard().text() == "print('hi')"
    assert code.copy.text() == "Copied"
    body.show_text("Hello world", [["Hello", True], [" world", False]], True)
    label = body._widgets[0]
    assert isinstance(label, TextBlock) and "background-color" in label.text()


def test_chat_view_follows_the_model(qtbot: QtBot) -> None:
    model = MessageListModel()
    view = ChatView(model)
    qtbot.addWidget(view)
    model.reset([Message(1, 1, "user", "q", 0.0), Message(2, 1, "assistant", "a", 0.0)])
    assert len(view.widgets) == 2
    assert view.widgets[1].regenerate.isVisibleTo(view.widgets[1])
    model.append(Message(3, 1, "user", "again", 0.0))
    model.append(Message(4, 1, "assistant", "", 0.0), streaming=True)
    assert not view.widgets[1].regenerate.isVisibleTo(view.widgets[1])
    assert view.widgets[3].footer.text() == "Answering…"
    model.stream(4, "partial", [], AnswerStats(completion_tokens=3, estimated=True))
    assert view.widgets[3].footer.text().startswith("≈ 3 tokens")
    model.remove_from(3)
    assert len(view.widgets) == 2
    with qtbot.waitSignal(view.edit_submitted) as edited:
        view.widgets[0].start_edit()
        view.widgets[0].editor.setPlainText("q2")
        view.widgets[0].submit_edit()
    assert edited.args == [1, "q2"]


def test_an_answer_cut_at_its_limit_offers_continue_when_it_is_the_last(qtbot: QtBot) -> None:
    model = MessageListModel()
    view = ChatView(model)
    qtbot.addWidget(view)
    cut = {"measured": AnswerStats(completion_tokens=512, finish_reason="length").to_dict(),
           "note": "Stopped at the 512-token limit."}
    model.reset([Message(1, 1, "user", "q", 0.0),
                 Message(2, 1, "assistant", "a long answer that", 0.0, COMPLETE, cut)])
    answer = view.widgets[1]
    assert answer.continue_button.isVisibleTo(answer)
    assert answer.note.text() == "Stopped at the 512-token limit."
    assert answer.note.property("kind") == "info"
    with qtbot.waitSignal(view.continue_requested):
        answer.continue_button.click()
    model.mark_streaming(2, note="")
    assert not answer.continue_button.isVisibleTo(answer) and not answer.note.text()
    model.append(Message(3, 1, "user", "next", 0.0))
    assert not answer.continue_button.isVisibleTo(answer)  # only the last answer


def test_settings_popover_reports_changes_on_close(qtbot: QtBot) -> None:
    popover = SettingsPopover()
    qtbot.addWidget(popover)
    anchor = Composer()
    qtbot.addWidget(anchor)
    popover.open_for(ChatSettings(), anchor)
    popover.temperature.setValue(0.2)
    with qtbot.waitSignal(popover.settings_changed) as changed:
        popover.close()
    assert changed.args[0] == ChatSettings(temperature=0.2)
    popover.open_for(ChatSettings(temperature=0.2), anchor)
    with qtbot.assertNotEmitted(popover.settings_changed):
        popover.close()
    popover.open_for(ChatSettings(), anchor)
    assert popover.overflow.currentText() == "Leave out the oldest messages"  # the default
    popover.overflow.setCurrentIndex(popover.overflow.findData(STOP_AT_LIMIT))
    with qtbot.waitSignal(popover.settings_changed) as changed:
        popover.close()
    assert changed.args[0] == ChatSettings(context_overflow=STOP_AT_LIMIT)
    popover.open_for(changed.args[0], anchor)
    assert popover.overflow.currentData() == STOP_AT_LIMIT


def test_panel_says_off_under_load_and_collapses(qtbot: QtBot) -> None:
    panel = SpeculationPanel(RecentAnswersModel())
    qtbot.addWidget(panel)
    panel.show_setting({"enabled": True, "method": "draft", "num_draft_tokens": 4})
    assert panel.pill.text() == "Speculation on" and "4 draft tokens" in panel.method.text()
    panel.show_health(Health("ready", load_off=True, url="http://x"))
    assert panel.pill.text() == "Off: high load"
    panel.show_final(AnswerStats(passes=10, accepted_per_position=(9, 5), acceptance_rate=0.7,
                                 tokens_per_second=31.0))
    assert panel.bars.rates == [0.9, 0.5] and panel.acceptance.value.text() == "70%"
    panel.set_collapsed(True)
    assert panel.width() < 60 and not panel.body.isVisibleTo(panel)


@pytest.fixture
def demo_page(qtbot: QtBot) -> Iterator[DemoPage]:
    db = AsyncStore(Store.memory())
    page = DemoPage(DemoController(db, WorkerClient()), [])
    qtbot.addWidget(page)
    yield page
    db.close()


def test_demo_replays_measured_timings(qtbot: QtBot, demo_page: DemoPage) -> None:
    slow = {"text": "a b c", "stats": {"tokens_per_second": 10.0, "completion_tokens": 3},
            "timeline": [[0.05, "a "], [0.15, "b "], [0.3, "c"]]}
    fast = {"text": "a b c", "stats": {"tokens_per_second": 25.0, "completion_tokens": 3},
            "timeline": [[0.05, "a b "], [0.12, "c"]]}
    run = DemoRun(1, 0.0, "p", "draft", slow, fast, True, None, 2.5)
    demo_page.show_run(run)
    assert demo_page.speedup.text() == "2.50× faster"  # 0.30 s against 0.12 s end to end
    assert "Identical" in demo_page.verdict.text()
    demo_page.replay()
    qtbot.waitUntil(lambda: demo_page.panes["speculative"].text.toPlainText() == "a b c")
    assert demo_page.panes["plain"].text.toPlainText() != "a b c"  # the slow side lags
    qtbot.waitUntil(lambda: not demo_page.replaying)
    assert demo_page.panes["plain"].text.toPlainText() == "a b c"


def test_learning_status_lines() -> None:
    running = describe_learning({"state": "running", "conversations": 9, "message": "step 3/100"})
    assert running == ("Learning from 9 chats at low priority… step 3/100", "")
    done = describe_learning({"state": "installed", "held_out_acceptance": 0.5, "previous": 0.25})
    assert done[1] == "Ok" and "50%" in done[0] and "previous head: 25%" in done[0]
    first = describe_learning({"state": "installed", "held_out_acceptance": 0.5, "previous": None})
    assert first[0].endswith("held-out chats: 50%.")
    assert describe_learning({"state": "kept"})[0].startswith("Done: the current head")
    assert describe_learning({"state": "failed", "message": "no memory"}) == (
        "Learning failed: no memory", "Error")
    assert "stay in the office" in describe_learning({"state": "idle"})[0]


def test_window_shortcuts_start_a_new_chat_and_search(qapp: QApplication, qtbot: QtBot,
                                                      tmp_path: Path) -> None:
    store = Store.open(tmp_path / DATABASE_NAME)
    kept = store.create_conversation("Heating works")
    store.close()
    with qasync_loop(qapp):
        anve = AnveApp(tmp_path, worker_url="http://127.0.0.1:9")  # no worker is needed
        window, sidebar = anve.window, anve.window.sidebar
        qtbot.addWidget(window)
        window.show()
        qtbot.waitExposed(window)
        window.show_health(Health("ready", 1.0, "ready", url="http://127.0.0.1:9"))
        assert "Ctrl+N" in sidebar.findChild(type(window.chat_page.composer.button),
                                             "Primary").toolTip()
        assert "Ctrl+F" in sidebar.search.toolTip() and "Ctrl+K" in sidebar.search.toolTip()
        anve.chat.open_conversation(kept.id)
        qtbot.waitUntil(lambda: anve.chat.current is not None)
        window.show_page("admin")
        window.new_chat_action.trigger()
        assert anve.chat.current is None and window.pages.currentIndex() == 0
        composer = window.chat_page.composer.input
        sidebar.set_search("heating")  # searched at once: no search timer left running
        window.search_action.trigger()
        assert sidebar.search.hasFocus() and sidebar.search.selectedText() == "heating"
        window.activateWindow()
        for key in (Qt.Key.Key_K, Qt.Key.Key_F):  # the keys themselves, from the question box
            composer.setFocus()
            qtbot.waitUntil(composer.hasFocus)
            composer.setPlainText("draft")
            qtbot.keyClick(composer, key, Qt.KeyboardModifier.ControlModifier)
            assert sidebar.search.hasFocus() and composer.toPlainText() == "draft"
        anve.chat.open_conversation(kept.id)
        qtbot.waitUntil(lambda: anve.chat.current is not None)
        qtbot.keyClick(sidebar.search, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
        assert anve.chat.current is None and composer.hasFocus()
        finish(qtbot, anve.shutdown())
