"""The desktop app against a real worker process on tiny random models (pytest-qt, offscreen).

One attached worker serves the module (target and an identical draft, so drafts are
accepted); the last test lets the app start its own worker and kills it mid-answer.
Widgets are driven through their methods (``set_text``, ``submit``, ``click``), never
by simulated mouse events. The tiny model's text is gibberish; only the mechanics
are checked. An answer the test acts on while it streams is held by the worker after
its first chunks (:class:`tests.worker_process.Hold`), so no outcome depends on how
fast the machine generates. No timing is asserted but in the ``perf`` tests (event-loop
lag while answers stream).
"""

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import psutil
import pytest
import qasync
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app.application import AnveApp
from app.lag import LagSummary
from app.launcher import WorkerCommand
from app.paths import DATABASE_NAME
from app.store import COMPLETE, INTERRUPTED, Store
from app.widgets.message_view import CodeBlock
from engine.worker.hold import HOLD_ENV
from tests.app_support import FakeWorker, finish, open_app, qasync_loop
from tests.tiny import save_tiny
from tests.worker_process import Hold, Http, WorkerProcess, start_worker

CONTEXT = 4096
PROMPT = "def add(a, b): the quick brown fox"
LONG = 3000  # answer tokens: more than any hold lets through or a perf test waits for
HELD = 3  # chunks of text a held answer sends before it waits for the test
WAIT_MS = 60_000


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    tmp = tmp_path_factory.mktemp("app-models")
    target = save_tiny(tmp / "tiny-llama", max_positions=CONTEXT)
    draft = save_tiny(tmp / "tiny-draft", max_positions=CONTEXT)
    return target, draft, tmp / "data"


@pytest.fixture(scope="module")
def hold(tmp_path_factory: pytest.TempPathFactory) -> Hold:
    return Hold(tmp_path_factory.mktemp("app-hold") / "hold")


@pytest.fixture(scope="module")
def worker(models: tuple[Path, Path, Path], hold: Hold,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    target, draft, data = models
    args = ["--profile", "light", "--target", str(target), "--draft", str(draft),
            "--method", "draft", "--data-dir", str(data)]
    with start_worker(args, tmp_path_factory.mktemp("app-worker"), hold) as proc:
        proc.wait_ready()
        yield proc


@pytest.fixture
def loop(qapp: QApplication) -> Iterator[qasync.QEventLoop]:
    with qasync_loop(qapp) as event_loop:
        yield event_loop


@pytest.fixture
def app(loop: qasync.QEventLoop, qtbot: QtBot, tmp_path: Path,
        worker: WorkerProcess) -> Iterator[AnveApp]:
    anve = open_app(qtbot, tmp_path, worker_url=worker.url)
    qtbot.waitUntil(lambda: anve.client.health.ready, timeout=WAIT_MS)
    yield anve
    finish(qtbot, anve.shutdown())


def stored(data: Path) -> Store:
    return Store.open(data / DATABASE_NAME)


def send(app: AnveApp, text: str, max_tokens: int) -> None:
    app.chat.set_settings(replace(app.chat.settings, temperature=0.0, max_tokens=max_tokens))
    composer = app.window.chat_page.composer
    composer.set_text(text)
    composer.submit()


def ask(app: AnveApp, qtbot: QtBot, text: str, max_tokens: int = 16) -> int:
    """Send a question and wait until its answer is saved; the answer's message id."""
    with qtbot.waitSignal(app.chat.answer_completed, timeout=WAIT_MS) as blocker:
        send(app, text, max_tokens)
    return int(blocker.args[0])


def streaming_shown(app: AnveApp) -> Callable[[], bool]:
    """Whether the view shows the streaming answer with some of its text."""
    def shown() -> bool:
        widgets = app.window.chat_page.view.widgets
        item = widgets[-1].item if widgets else None
        return (item is not None and item.role == "assistant" and item.streaming
                and bool(item.content))
    return shown


def saved_answer(data: Path) -> str:
    store = stored(data)
    conversations = store.conversations()
    messages = store.messages(conversations[0].id) if conversations else []
    return messages[1].content if len(messages) == 2 else ""


def stream_until_saved(app: AnveApp, qtbot: QtBot, hold: Hold, data: Path) -> None:
    """Let a held answer on, one chunk at a time, until the answer's row has some text.

    The chat saves a streaming answer at most every ``SAVE_EVERY_S``, and its first
    save may come before any text; the answer stays held between the chunks."""
    allowed, deadline = HELD, time.monotonic() + WAIT_MS / 1000
    while not saved_answer(data):
        assert time.monotonic() < deadline, "the streaming answer was never saved with text"
        allowed += 1
        with qtbot.waitSignal(app.chat.answer_progressed, timeout=WAIT_MS):
            hold.allow(allowed)


# --- chat ------------------------------------------------------------------------------


def test_answer_streams_into_the_view_and_lands_in_sqlite(
    app: AnveApp, qtbot: QtBot, tmp_path: Path, hold: Hold
) -> None:
    model = app.chat.messages
    with hold.after(HELD):  # the rest of the answer waits until the view shows its start
        send(app, PROMPT, 24)
        qtbot.waitUntil(streaming_shown(app), timeout=WAIT_MS)
        assert app.chat.busy and model.items[-1].streaming
        with qtbot.waitSignal(app.chat.answer_completed, timeout=WAIT_MS) as blocker:
            hold.release()
    answer_id = int(blocker.args[0])
    item = model.items[-1]
    assert (item.id, item.status, item.streaming) == (answer_id, COMPLETE, False)
    assert item.stats is not None and item.stats.method == "draft"
    assert 0 < item.stats.completion_tokens <= 24 and item.stats.accepted > 0
    widget = app.window.chat_page.view.widgets[-1]
    assert "tok/s" in widget.footer.text() and "draft model" in widget.footer.text()
    assert app.window.panel.speed.value.text() != "–"
    assert len(app.answers.items) == 1
    store = stored(tmp_path)
    user, answer = store.messages(store.conversations()[0].id)
    assert (user.role, user.content) == ("user", PROMPT)
    assert (answer.status, answer.content) == (COMPLETE, item.content)
    assert answer.stats is not None and answer.stats["measured"]["method"] == "draft"
    assert "".join(text for text, _ in answer.pieces or []) == answer.content
    popover = app.window.chat_page.popover
    app.window.chat_page.open_settings()
    popover.max_tokens.setValue(64)
    popover.system_prompt.setPlainText("Answer in French.")
    popover.close()
    qtbot.waitUntil(lambda: stored(tmp_path).conversations()[0].settings.max_tokens == 64)
    assert stored(tmp_path).conversations()[0].settings.system_prompt == "Answer in French."


def test_stop_keeps_the_partial_answer(
    app: AnveApp, qtbot: QtBot, tmp_path: Path, hold: Hold
) -> None:
    model = app.chat.messages
    with hold.after(HELD):  # the answer cannot end before Stop
        send(app, PROMPT, LONG)
        qtbot.waitUntil(streaming_shown(app), timeout=WAIT_MS)
        stream_until_saved(app, qtbot, hold, tmp_path)
        store = stored(tmp_path)
        saved = store.messages(store.conversations()[0].id)[1]  # saved while it streams
        assert saved.status == INTERRUPTED and saved.content
        assert model.items[1].content.startswith(saved.content)
        assert app.chat.busy
        with qtbot.waitSignal(app.chat.answer_completed, timeout=WAIT_MS):
            app.window.chat_page.composer.button.click()  # Send became Stop
    item = model.items[1]
    assert item.status == INTERRUPTED and item.note == "Stopped." and item.content
    assert not app.window.chat_page.composer.busy
    store = stored(tmp_path)
    answer = store.messages(store.conversations()[0].id)[1]
    assert (answer.status, answer.content) == (INTERRUPTED, item.content)


@pytest.mark.perf
def test_the_event_loop_stays_smooth_while_a_long_answer_streams(
    app: AnveApp, qtbot: QtBot
) -> None:
    send(app, PROMPT, LONG)
    model = app.chat.messages
    qtbot.waitUntil(lambda: len(model.items) == 2 and len(model.items[1].content) > 40,
                    timeout=WAIT_MS)
    app.lag.reset()
    qtbot.wait(4000)  # a long answer streaming into the window, at this machine's pace
    lag = app.lag.summary()
    streaming = app.chat.busy
    if streaming:
        with qtbot.waitSignal(app.chat.answer_completed, timeout=WAIT_MS):
            app.chat.stop()
    shown = len(model.items[1].content)
    print(f"\nevent-loop lag while streaming a long answer ({shown} characters, "
          f"{'still streaming' if streaming else 'ended'} after 4 s): {lag}")
    assert lag.samples > 50 and lag.p95_ms < 50, lag


def test_regenerate_and_edit_and_resend(app: AnveApp, qtbot: QtBot, tmp_path: Path) -> None:
    first = ask(app, qtbot, "first question")
    view = app.window.chat_page.view
    assert view.widgets[-1].regenerate.isVisibleTo(view)
    with qtbot.waitSignal(app.chat.answer_completed, timeout=WAIT_MS) as blocker:
        view.widgets[-1].regenerate.click()
    assert blocker.args[0] != first
    assert [m.role for m in app.chat.messages.items] == ["user", "assistant"]
    editor = view.widgets[0]
    editor.start_edit()
    editor.editor.setPlainText("second question")
    with qtbot.waitSignal(app.chat.answer_completed, timeout=WAIT_MS):
        editor.submit_edit()
    assert app.chat.messages.items[0].content == "second question"
    store = stored(tmp_path)
    messages = store.messages(store.conversations()[0].id)
    assert [(m.role, m.status) for m in messages] == [("user", COMPLETE), ("assistant", COMPLETE)]
    assert messages[0].content == "second question"


def test_search_rename_delete_undo_and_export(app: AnveApp, qtbot: QtBot,
                                              tmp_path: Path) -> None:
    sidebar, conversations = app.window.sidebar, app.chat.conversations
    ask(app, qtbot, "the zebra budget", max_tokens=6)
    zebra = app.chat.current
    sidebar.new_chat()
    ask(app, qtbot, "heating on floor three", max_tokens=6)
    heating = app.chat.current
    assert zebra is not None and heating is not None
    assert [c.id for c in conversations.items] == [heating.id, zebra.id]
    sidebar.set_search("zebr")
    qtbot.waitUntil(lambda: [c.id for c in conversations.items] == [zebra.id])
    sidebar.set_search("")
    qtbot.waitUntil(lambda: len(conversations.items) == 2)
    sidebar.rename(zebra.id, "Budget talk")
    qtbot.waitUntil(lambda: conversations.items[1].title == "Budget talk")
    sidebar.delete(heating.id)
    qtbot.waitUntil(lambda: len(conversations.items) == 1)
    assert sidebar.undo_bar.isVisibleTo(sidebar)
    sidebar.undo_delete()
    qtbot.waitUntil(lambda: len(conversations.items) == 2)
    sidebar.delete(heating.id)
    qtbot.waitUntil(lambda: len(conversations.items) == 1)
    sidebar.confirm_delete()
    app.chat.open_conversation(zebra.id)
    qtbot.waitUntil(lambda: app.window.chat_page.title.text() == "Budget talk")
    for fmt, name in (("markdown", "chat.md"), ("json", "chat.json")):
        with qtbot.waitSignal(app.chat.exported, timeout=WAIT_MS):
            app.window.chat_page.export_to(tmp_path / name, fmt)
    assert (tmp_path / "chat.md").read_text().startswith("# Budget talk\n")
    exported = json.loads((tmp_path / "chat.json").read_text())
    assert exported["messages"][0]["content"] == "the zebra budget"
    finish(qtbot, app.chat.wait())
    store = stored(tmp_path)
    assert [c.title for c in store.conversations()] == ["Budget talk"]
    assert store.db.execute("SELECT count(*) FROM conversations").fetchone()[0] == 1


# --- admin -------------------------------------------------------------------------------


@pytest.fixture
def restore_setting(worker: WorkerProcess) -> Iterator[None]:
    before = Http(worker.port).get("/v1/speculation").json()
    yield
    keep = {k: before[k] for k in ("enabled", "method", "num_draft_tokens", "load_threshold")}
    assert Http(worker.port).request("PUT", "/v1/speculation", keep).status == 200


@pytest.mark.usefixtures("restore_setting")
def test_admin_refuses_a_wrong_passphrase_and_changes_the_method_live(
    app: AnveApp, qtbot: QtBot, tmp_path: Path, worker: WorkerProcess
) -> None:
    page, admin = app.window.admin_page, app.admin
    app.window.show_page("admin")
    with qtbot.waitSignal(admin.unlocked, timeout=WAIT_MS):
        page.unlock_with("correct horse battery")  # the first use sets it
    admin.lock()
    with qtbot.waitSignal(admin.refused, timeout=WAIT_MS) as refused:
        page.unlock_with("wrong horse battery")
    assert refused.args == ["Wrong passphrase."]
    assert page.stack.currentIndex() == 0 and not admin.is_unlocked
    with qtbot.waitSignal(app.client.speculation_received, timeout=WAIT_MS):
        page.unlock_with("correct horse battery")
    assert page.stack.currentIndex() == 1
    qtbot.waitUntil(lambda: page.models.rowCount() == 2)
    assert page.address.text() == worker.url
    assert {page.models.item(r, 1).text() for r in range(2)} == {"target", "draft"}
    page.choose_method("ngram")
    assert page.changes() == {"method": "ngram"}
    with qtbot.waitSignal(app.client.speculation_received, timeout=WAIT_MS) as confirmed:
        page.apply()
    assert confirmed.args[0]["method"] == "ngram"
    assert "The worker confirms" in page.apply_status.text()
    assert Http(worker.port).get("/v1/speculation").json()["method"] == "ngram"
    app.window.show_page("chat")
    ask(app, qtbot, PROMPT)
    stats = app.chat.messages.items[-1].stats
    assert stats is not None and stats.method == "ngram"
    assert "n-gram" in app.window.chat_page.view.widgets[-1].footer.text()
    record = stored(tmp_path).setting("admin_passphrase")
    assert record.startswith("scrypt$") and "horse" not in record


def test_admin_learns_from_past_chats_and_the_worker_then_offers_eagle(
    app: AnveApp, qtbot: QtBot, worker: WorkerProcess
) -> None:
    for question in ("def add(a, b):", "def mul(a, b):", "class Stack:", "def fib(n):"):
        app.window.sidebar.new_chat()
        ask(app, qtbot, question, max_tokens=24)
    page, admin = app.window.admin_page, app.admin
    app.window.show_page("admin")
    with qtbot.waitSignal(admin.learning_refused, timeout=WAIT_MS) as refused:
        page.learn()  # locked: nothing is read or sent
    assert refused.args == ["Unlock the admin controls first."]
    with qtbot.waitSignal(admin.unlocked, timeout=WAIT_MS):
        page.unlock_with("correct horse battery")
    with qtbot.waitSignal(admin.learning_changed, timeout=WAIT_MS,
                          check_params_cb=lambda s: s["state"] == "running"):
        page.learn({"steps": 4, "seq_len": 32, "tokens": 1200})
    assert not page.learn_button.isEnabled() and page.stop_learning_button.isEnabled()
    assert "Learning from 4 chats" in page.learning_status.text()
    with qtbot.waitSignal(admin.learning_changed, timeout=240_000,
                          check_params_cb=lambda s: s["state"] != "running") as done:
        pass
    assert done.args[0]["state"] == "installed", done.args[0]
    assert "new draft head is in use" in page.learning_status.text()
    qtbot.waitUntil(lambda: "eagle" in (page.setting.get("available_methods") or ()),
                    timeout=WAIT_MS)
    assert "eagle" in Http(worker.port).get("/v1/speculation").json()["available_methods"]
    assert page.learn_button.isEnabled() and not page.stop_learning_button.isEnabled()


# --- demo --------------------------------------------------------------------------------


def test_demo_fills_both_panes_checks_identity_and_is_stored(
    app: AnveApp, qtbot: QtBot, tmp_path: Path
) -> None:
    page = app.window.demo_page
    app.window.show_page("demo")
    assert page.prompt_choice.count() == 7  # the shipped prompts and "your own"
    assert {p.kind for p in page.prompts} == {"code", "summary", "chat"}
    sides: set[str] = set()
    app.demo.pane_updated.connect(lambda side, _progress: sides.add(side))
    page.max_tokens.setValue(40)
    with qtbot.waitSignal(app.demo.run_finished, timeout=WAIT_MS) as finished:
        assert page.start(PROMPT, "draft")
    run = finished.args[0]
    assert sides == {"plain", "speculative"}  # both streamed live
    plain, fast = (page.panes[side].text.toPlainText() for side in ("plain", "speculative"))
    assert plain and plain == fast == run.plain["text"] == run.speculative["text"]
    assert run.identical and run.first_difference is None
    assert run.speculative["stats"]["method"] == "draft"
    assert run.plain["stats"]["method"] == "off"
    assert "Identical" in page.verdict.text()
    for side in (run.plain, run.speculative):  # both started cold, as the worker confirms
        assert (side["stats"]["cache"], side["stats"]["cached_tokens"]) == ("cold", 0)
    assert page.start_note.text().startswith("Both runs started cold")
    assert "after the first token" in page.details.text()
    assert "Method: draft model" in page.details.text()
    assert [r.id for r in stored(tmp_path).demo_runs()] == [run.id]
    assert len(app.demo.runs.items) == 1
    page.replay()
    assert page.replaying
    qtbot.waitUntil(lambda: not page.replaying, timeout=WAIT_MS)
    assert page.panes["speculative"].text.toPlainText() == fast


def test_closing_the_app_leaves_an_attached_worker_running(
    app: AnveApp, qtbot: QtBot, worker: WorkerProcess
) -> None:
    assert app.launcher is None
    finish(qtbot, app.shutdown())
    assert worker.proc.poll() is None
    assert Http(worker.port).get("/health").json()["status"] == "ready"


# --- the app's own worker -----------------------------------------------------------------


@pytest.fixture
def own_hold(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Hold:
    """Where the worker that the app starts in this test waits (its environment says)."""
    own = Hold(tmp_path / "own-hold")
    monkeypatch.setenv(HOLD_ENV, str(own.path))
    return own


@pytest.fixture
def own_app(loop: qasync.QEventLoop, qtbot: QtBot, tmp_path: Path, own_hold: Hold,
            models: tuple[Path, Path, Path]) -> Iterator[AnveApp]:
    """The app with a worker of its own (``python -m engine.worker`` on the tiny models)."""
    target, draft, data = models
    command = WorkerCommand("light", ("--target", str(target), "--draft", str(draft),
                                      "--data-dir", str(data)))
    anve = open_app(qtbot, tmp_path, command=command)
    yield anve
    finish(qtbot, anve.shutdown())


def test_worker_killed_mid_answer_is_restarted_and_the_next_question_works(
    own_app: AnveApp, own_hold: Hold, qtbot: QtBot, tmp_path: Path
) -> None:
    app = own_app
    composer = app.window.chat_page.composer
    assert composer.blocked is not None and not composer.input.isEnabled()
    assert app.window.banner.isVisibleTo(app.window)
    qtbot.waitUntil(lambda: app.client.health.ready, timeout=WAIT_MS)
    assert composer.blocked is None and composer.input.isEnabled()
    first_pid = app.launcher.pid if app.launcher else None
    assert first_pid is not None
    model = app.chat.messages
    with own_hold.after(HELD):  # the answer is running when the worker dies
        send(app, PROMPT, LONG)
        qtbot.waitUntil(streaming_shown(app), timeout=WAIT_MS)
        with qtbot.waitSignal(app.chat.answer_completed, timeout=WAIT_MS):
            os.kill(first_pid, signal.SIGKILL)
    item = model.items[1]
    assert item.status == INTERRUPTED and item.note.startswith("Interrupted") and item.content
    assert app.window.chat_page.notice.isVisibleTo(app.window)
    store = stored(tmp_path)
    answer = store.messages(store.conversations()[0].id)[1]
    assert (answer.status, answer.content) == (INTERRUPTED, item.content)
    qtbot.waitUntil(lambda: app.window.banner.isVisibleTo(app.window), timeout=WAIT_MS)
    qtbot.waitUntil(lambda: app.client.health.ready and app.launcher is not None
                    and app.launcher.pid not in (None, first_pid), timeout=WAIT_MS)
    second_pid = app.launcher.pid if app.launcher else None
    ask(app, qtbot, "and now?", max_tokens=8)
    assert model.items[-1].status == COMPLETE and model.items[-1].content
    finish(qtbot, app.shutdown())
    assert second_pid is not None and not psutil.pid_exists(second_pid)


# --- a fast stream: rendering and event-loop lag -----------------------------------------------


def long_fast_markdown_answer(qtbot: QtBot, tmp_path: Path, measure_idle: bool) -> LagSummary:
    """Stream a long Markdown answer from the fake worker into the window and check it is
    all shown; the event-loop lag while it streamed."""
    with FakeWorker(chars=12000, chunk=8) as fake:  # ~2,000 characters a second: 20x a CPU
        # model's pace; the answer ends up with 20 code blocks
        app = open_app(qtbot, tmp_path, worker_url=fake.url)
        try:
            qtbot.waitUntil(lambda: app.client.health.ready, timeout=WAIT_MS)
            idle = None
            if measure_idle:
                app.lag.reset()
                qtbot.wait(1500)
                idle = app.lag.summary()
            app.lag.reset()
            ask(app, qtbot, "Explain speculative decoding at length.", max_tokens=LONG)
            lag = app.lag.summary()
            item = app.chat.messages.items[-1]
            print(f"\nevent-loop lag while a {len(item.content)}-character Markdown answer "
                  f"streamed: {lag} (idle window: {idle})")
            assert item.status == COMPLETE and len(item.content) == 12000
            blocks = app.window.chat_page.view.widgets[-1].body._widgets
            assert sum(isinstance(b, CodeBlock) for b in blocks) >= 20
            return lag
        finally:
            finish(qtbot, app.shutdown())


def test_a_long_fast_markdown_answer_is_shown_whole(
    loop: qasync.QEventLoop, qtbot: QtBot, tmp_path: Path
) -> None:
    long_fast_markdown_answer(qtbot, tmp_path, measure_idle=False)


@pytest.mark.perf
def test_a_long_fast_markdown_answer_keeps_the_event_loop_responsive(
    loop: qasync.QEventLoop, qtbot: QtBot, tmp_path: Path
) -> None:
    lag = long_fast_markdown_answer(qtbot, tmp_path, measure_idle=True)
    assert lag.p95_ms < 50, lag
