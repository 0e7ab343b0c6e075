"""ChatController against a fake client: no worker process, no network, no clock.

The fake client records each request and sends nothing by itself: every token and every
end of an answer is emitted by the test, so what is checked never depends on how fast
the machine is. Its live figures come from the app's own :class:`AnswerStream` fed with
the worker's chunk shapes. The history is an in-memory SQLite store behind AsyncStore.
"""

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app.answer import AnswerStats, AnswerStream
from app.client import COMPLETE as DONE
from app.client import ERROR as FAILED
from app.client import INTERRUPTED as CUT
from app.client import STOPPED, AnswerProgress, AnswerRequest, AnswerResult, Health
from app.controllers import chat as chat_module
from app.controllers.chat import (
    LOST_NOTE,
    RESTARTED_NOTE,
    RESTARTING_NOTE,
    ChatController,
)
from app.store import COMPLETE, ERROR, INTERRUPTED, AsyncStore, ChatSettings, Message, Store
from engine.protocol import ROLLING_WINDOW, STOP_AT_LIMIT
from tests.app_support import finish, qasync_loop


class FakeClient(QObject):
    """The part of :class:`app.client.WorkerClient` the chat controller uses."""

    answer_progressed = Signal(str, object)
    answer_finished = Signal(str, object)
    health_changed = Signal(object)

    def __init__(self) -> None:
        super().__init__()
        self.requests: dict[str, AnswerRequest] = {}
        self.cancelled: list[str] = []
        self._ids = itertools.count(1)
        self._streams: dict[str, AnswerStream] = {}

    def ask(self, request: AnswerRequest) -> str:
        rid = f"answer-{next(self._ids)}"
        self.requests[rid] = request
        self._streams[rid] = AnswerStream(started=0.0)
        self._streams[rid].add({"choices": [{"delta": {"role": "assistant", "content": ""}}],
                                "anve": {"method": "ngram"}}, 0.0)
        return rid

    def cancel(self, rid: str) -> None:
        self.cancelled.append(rid)  # the test then ends the answer as the real client would

    @property
    def last(self) -> str:
        return list(self.requests)[-1]

    def token(self, rid: str, text: str, anve: dict[str, Any] | None = None) -> None:
        """One chunk of the answer, as the worker streams it (plus ``anve`` extensions)."""
        stream = self._streams[rid]
        stream.add({"choices": [{"delta": {"content": text}}],
                    "anve": {"pieces": [[text, False]], "tokens": 1, **(anve or {})}}, 1.0)
        self.answer_progressed.emit(rid, AnswerProgress(stream.text, stream.pieces,
                                                        stream.live_stats(1.0)))

    def end(self, rid: str, outcome: str = DONE, *, message: str = "", lost: bool = False,
            code: str = "", **stats: Any) -> None:
        text = self._streams[rid].text
        figures: dict[str, Any] = {"completion_tokens": len(text.split()), **stats}
        measured = AnswerStats(method="ngram", enabled=True, tokens_per_second=20.0, **figures)
        self.answer_finished.emit(rid, AnswerResult(outcome, text, [[text, False]] if text
                                                    else [], measured, [], message, lost, code))


@pytest.fixture
def env(qapp: QApplication, qtbot: QtBot) -> Iterator[tuple[ChatController, FakeClient, Store]]:
    with qasync_loop(qapp):
        store = Store.memory()
        db = AsyncStore(store)
        client = FakeClient()
        chat = ChatController(db, client)  # type: ignore[arg-type]
        chat.load()
        yield chat, client, store
        finish(qtbot, chat.wait())
        db.close()


def ask(chat: ChatController, client: FakeClient, qtbot: QtBot, text: str) -> str:
    """Send a question; the id of its request once the controller has sent it."""
    asked = len(client.requests)
    assert chat.send(text)
    qtbot.waitUntil(lambda: len(client.requests) > asked)
    return client.last


def settle(chat: ChatController, qtbot: QtBot) -> None:
    """Wait for the controller's background saves."""
    finish(qtbot, chat.wait())


def stored(chat: ChatController, qtbot: QtBot) -> list[Message]:
    settle(chat, qtbot)
    assert chat.current is not None
    return list(finish(qtbot, chat.db.call(Store.messages, chat.current.id)))


def test_send_stores_the_question_streams_the_answer_and_finalises_it(
    env: tuple[ChatController, FakeClient, Store], qtbot: QtBot
) -> None:
    chat, client, _ = env
    busy: list[bool] = []
    chat.busy_changed.connect(busy.append)
    assert not chat.send("   ")  # nothing to send
    rid = ask(chat, client, qtbot, "What is lunch?")
    request = client.requests[rid]
    assert request.messages == [{"role": "system", "content": ChatSettings().system_prompt},
                                {"role": "user", "content": "What is lunch?"}]
    assert (request.max_tokens, request.context_overflow) == (512, ROLLING_WINDOW)
    assert not request.continue_answer and chat.busy
    assert not chat.send("a second question while answering")
    assert [m.status for m in stored(chat, qtbot)] == [COMPLETE, INTERRUPTED]  # kept already
    client.token(rid, "Soup")
    answer = chat.messages.items[1]
    assert answer.content == "Soup" and answer.streaming
    assert "· n-gram lookup ·" in answer.footer()  # the method from the start, never "unknown"
    with qtbot.waitSignal(chat.answer_completed) as completed:
        client.token(rid, " and bread.")
        client.end(rid, finish_reason="stop")
    assert completed.args[0] == answer.id and not chat.busy and busy == [True, False]
    assert (answer.status, answer.note, answer.streaming) == (COMPLETE, "", False)
    assert not answer.can_continue
    saved = stored(chat, qtbot)[1]
    assert (saved.content, saved.status) == ("Soup and bread.", COMPLETE)
    assert saved.stats is not None and saved.stats["measured"]["finish_reason"] == "stop"
    assert chat.conversations.items[0].title == "What is lunch?"


def test_the_answer_is_saved_while_it_streams(
    env: tuple[ChatController, FakeClient, Store], qtbot: QtBot,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    chat, client, _ = env
    monkeypatch.setattr(chat_module, "SAVE_EVERY_S", 0.0)  # save at every update
    rid = ask(chat, client, qtbot, "Tell me a story")
    client.token(rid, "Once upon")
    qtbot.waitUntil(lambda: stored(chat, qtbot)[1].content == "Once upon")
    client.token(rid, " a time")
    qtbot.waitUntil(lambda: stored(chat, qtbot)[1].content == "Once upon a time")
    assert stored(chat, qtbot)[1].status == INTERRUPTED  # until it ends
    client.end(rid, finish_reason="stop")
    qtbot.waitUntil(lambda: stored(chat, qtbot)[1].status == COMPLETE)


def test_stop_keeps_the_partial_answer_as_interrupted(
    env: tuple[ChatController, FakeClient, Store], qtbot: QtBot
) -> None:
    chat, client, _ = env
    rid = ask(chat, client, qtbot, "Count to a hundred")
    client.token(rid, "1 2 3")
    chat.stop()
    assert client.cancelled == [rid]
    with qtbot.assertNotEmitted(chat.notice_posted):  # the user knows: they stopped it
        client.end(rid, STOPPED, message="stopped", finish_reason="cancelled")
    answer = chat.messages.items[1]
    assert (answer.status, answer.note, answer.content) == (INTERRUPTED, "Stopped.", "1 2 3")
    saved = stored(chat, qtbot)[1]
    assert (saved.status, saved.content) == (INTERRUPTED, "1 2 3")
    assert saved.stats is not None and saved.stats["note"] == "Stopped."
    chat.stop()  # nothing streams: nothing to cancel
    assert client.cancelled == [rid]


def test_regenerate_replaces_the_last_answer_and_edit_resends_a_question(
    env: tuple[ChatController, FakeClient, Store], qtbot: QtBot
) -> None:
    chat, client, _ = env
    rid = ask(chat, client, qtbot, "Name a colour")
    client.token(rid, "Red.")
    client.end(rid, finish_reason="stop")
    settle(chat, qtbot)
    chat.regenerate()
    qtbot.waitUntil(lambda: len(client.requests) == 2)
    again = client.last
    assert client.requests[again].messages[-1] == {"role": "user", "content": "Name a colour"}
    client.token(again, "Blue.")
    client.end(again, finish_reason="stop")
    assert [m.content for m in stored(chat, qtbot)] == ["Name a colour", "Blue."]
    question = chat.messages.items[0].id
    chat.edit_and_resend(question, "Name a fruit")
    qtbot.waitUntil(lambda: len(client.requests) == 3)
    assert client.requests[client.last].messages[1:] == [
        {"role": "user", "content": "Name a fruit"}]
    client.token(client.last, "Pear.")
    client.end(client.last, finish_reason="stop")
    assert [m.content for m in stored(chat, qtbot)] == ["Name a fruit", "Pear."]


def test_an_error_is_marked_left_out_of_the_next_prompt_and_told(
    env: tuple[ChatController, FakeClient, Store], qtbot: QtBot
) -> None:
    chat, client, _ = env
    notices: list[tuple[str, str]] = []
    chat.notice_posted.connect(lambda level, text: notices.append((level, text)))
    rid = ask(chat, client, qtbot, "Hello")
    client.end(rid, FAILED, message="the engine broke")
    answer = chat.messages.items[1]
    assert (answer.status, answer.note) == (ERROR, "The worker could not answer: the engine "
                                                   "broke")
    assert notices == [("error", answer.note)]
    assert stored(chat, qtbot)[1].status == ERROR
    rid = ask(chat, client, qtbot, "Hello again")
    assert [m["content"] for m in client.requests[rid].messages[1:]] == ["Hello", "Hello again"]
    client.end(rid, FAILED, message="the conversation is 9000 tokens",
               code="context_length_exceeded")
    assert "Leave out the oldest messages" in chat.messages.items[-1].note
    assert "9000 tokens" in chat.messages.items[-1].note


def test_an_answer_cut_at_its_limit_says_so_and_continues_in_place(
    env: tuple[ChatController, FakeClient, Store], qtbot: QtBot
) -> None:
    chat, client, _ = env
    chat.set_settings(ChatSettings(max_tokens=3))
    rid = ask(chat, client, qtbot, "Explain tides")
    assert client.requests[rid].max_tokens == 3
    client.token(rid, "The moon pulls")
    client.end(rid, finish_reason="length")
    answer = chat.messages.items[1]
    assert (answer.status, answer.note) == (COMPLETE, "Stopped at the 3-token limit.")
    assert answer.can_continue
    # the mark survives a restart: it is stored with the answer
    chat.open_conversation(chat.conversations.items[0].id)
    qtbot.waitUntil(lambda: chat.messages.items[1] is not answer)
    reopened = chat.messages.items[1]
    assert reopened.can_continue and reopened.note == "Stopped at the 3-token limit."
    chat.continue_answer()
    qtbot.waitUntil(lambda: len(client.requests) == 2)
    go_on = client.requests[client.last]
    assert go_on.continue_answer and go_on.messages[-1] == {"role": "assistant",
                                                            "content": "The moon pulls"}
    assert go_on.messages[-2] == {"role": "user", "content": "Explain tides"}
    assert stored(chat, qtbot)[1].status == INTERRUPTED  # while it is continued
    item = chat.messages.items[1]
    assert item.streaming and item.note == "" and chat.busy
    client.token(client.last, " the sea.")
    assert item.content == "The moon pulls the sea."
    assert item.footer().startswith("≈ 4 tokens")  # 3 + the chunk's 1: the whole answer
    client.end(client.last, finish_reason="stop")
    assert (item.content, item.status, item.note) == ("The moon pulls the sea.", COMPLETE, "")
    assert item.stats is not None and item.stats.completion_tokens == 3 + 2
    assert item.pieces == [["The moon pulls the sea.", False]]
    saved = stored(chat, qtbot)[1]
    assert (saved.content, saved.status) == ("The moon pulls the sea.", COMPLETE)
    assert saved.stats is not None and saved.stats["measured"]["completion_tokens"] == 5
    chat.continue_answer()  # complete now: nothing to continue
    settle(chat, qtbot)
    assert len(client.requests) == 2


def test_a_continuation_that_fails_leaves_the_answer_as_it_was(
    env: tuple[ChatController, FakeClient, Store], qtbot: QtBot
) -> None:
    chat, client, _ = env
    rid = ask(chat, client, qtbot, "Explain tides")
    client.token(rid, "The moon")
    client.end(rid, finish_reason="length", completion_tokens=512)
    chat.continue_answer()
    qtbot.waitUntil(lambda: len(client.requests) == 2)
    client.end(client.last, FAILED, message="the models are still loading")
    item = chat.messages.items[1]
    assert (item.content, item.status) == ("The moon", COMPLETE)
    assert item.note == ("Stopped at the 512-token limit. Could not continue: the models are "
                         "still loading")
    assert item.can_continue  # try again later
    assert stored(chat, qtbot)[1].status == COMPLETE


def test_an_answer_says_when_a_rolling_window_left_messages_out(
    env: tuple[ChatController, FakeClient, Store], qtbot: QtBot
) -> None:
    chat, client, _ = env
    rid = ask(chat, client, qtbot, "Question 179")
    client.token(rid, "Here", {"context_window": {"dropped_messages": 12,
                                                  "prompt_tokens": 7000}})
    note = "12 earlier messages were left out: the conversation no longer fits the model's context."
    assert chat.messages.items[1].note == note  # while it streams
    client.end(rid, finish_reason="stop", dropped_messages=12)
    assert chat.messages.items[1].note == note
    saved = stored(chat, qtbot)[1]
    assert saved.stats is not None and saved.stats["note"] == note
    chat.set_settings(ChatSettings(context_overflow=STOP_AT_LIMIT))
    rid = ask(chat, client, qtbot, "Question 180")
    assert client.requests[rid].context_overflow == STOP_AT_LIMIT


def test_a_crashed_worker_is_told_in_words_and_the_note_follows_its_restart(
    env: tuple[ChatController, FakeClient, Store], qtbot: QtBot
) -> None:
    chat, client, _ = env
    notices: list[tuple[str, str]] = []
    chat.notice_posted.connect(lambda level, text: notices.append((level, text)))
    rid = ask(chat, client, qtbot, "Write a memo")
    client.token(rid, "Dear all,")
    client.end(rid, CUT, message="lost the connection to the worker", lost=True)
    answer = chat.messages.items[1]
    assert (answer.status, answer.note) == (INTERRUPTED, LOST_NOTE)
    assert "TransferEncodingError" not in answer.note and notices == [("warning", LOST_NOTE)]
    chat.worker_stopped("the worker was killed or crashed")  # the launcher hears it next
    assert answer.note == RESTARTING_NOTE
    chat.worker_restarted("http://127.0.0.1:1")
    assert answer.note == RESTARTED_NOTE
    assert notices[-1][0] == "info" and "restarted" in notices[-1][1]
    qtbot.waitUntil(lambda: (stored(chat, qtbot)[1].stats or {}).get("note") == RESTARTED_NOTE)
    assert stored(chat, qtbot)[1].content == "Dear all,"
    # the other order: the worker's exit is heard before the broken stream
    rid = ask(chat, client, qtbot, "Again")
    client.token(rid, "Dear")
    chat.worker_stopped("the worker was killed or crashed")
    client.end(rid, CUT, message="lost the connection to the worker", lost=True)
    assert chat.messages.items[-1].note == RESTARTING_NOTE
    chat.worker_restarted("http://127.0.0.1:2")
    assert chat.messages.items[-1].note == RESTARTED_NOTE
    assert chat.messages.items[1].note == RESTARTED_NOTE  # the earlier one is not told again


def test_a_lost_connection_to_a_worker_that_kept_running_says_only_that(
    env: tuple[ChatController, FakeClient, Store], qtbot: QtBot
) -> None:
    chat, client, _ = env
    rid = ask(chat, client, qtbot, "Write a memo")
    client.end(rid, CUT, message="lost the connection to the worker", lost=True)
    client.health_changed.emit(Health("ready"))  # it answers again: it never stopped
    chat.worker_stopped("much later, for another reason")
    chat.worker_restarted("http://127.0.0.1:3")
    assert chat.messages.items[1].note == LOST_NOTE
