"""The app's list models, checked with pytest-qt's model tester and by their own methods."""

import time

from pytestqt.modeltest import ModelTester

from app.answer import AnswerStats
from app.models.answers import RecentAnswersModel
from app.models.conversations import ConversationListModel, Roles, when
from app.models.demo_runs import DemoRunListModel, summary
from app.models.messages import MessageListModel
from app.models.messages import Roles as MessageRoles
from app.store import ERROR, INTERRUPTED, Conversation, DemoRun, Message


def message(i: int, role: str = "user", content: str = "hi", status: str = "complete",
            stats: dict[str, object] | None = None) -> Message:
    return Message(i, 1, role, content, 0.0, status, stats)


def test_message_model_streams_finishes_and_truncates(qtmodeltester: ModelTester) -> None:
    model = MessageListModel()
    model.reset([message(1), message(2, "assistant", "old answer")])
    qtmodeltester.check(model)
    model.append(message(3), streaming=False)
    model.append(message(4, "assistant", "", INTERRUPTED), streaming=True)
    model.stream(4, "Hel", [["Hel", True]], AnswerStats(completion_tokens=2, estimated=True))
    assert model.data(model.index(3)) == "Hel"
    assert model.data(model.index(3), MessageRoles.STREAMING) is True
    assert model.data(model.index(3), MessageRoles.FOOTER).startswith("≈ 2 tokens")
    assert model.history()[-1] == {"role": "user", "content": "hi"}  # streaming: not yet
    model.finish(4, "Hello", [["Hello", True]], INTERRUPTED, None, "Stopped.")
    assert model.items[3].note == "Stopped." and not model.items[3].streaming
    assert model.history()[-1] == {"role": "assistant", "content": "Hello"}
    qtmodeltester.check(model)
    model.remove_from(3)
    assert [m.id for m in model.items] == [1, 2]
    model.stream(99, "ignored", [])
    qtmodeltester.check(model)


def test_message_model_reads_stored_stats_and_skips_failed_answers() -> None:
    stats = {"measured": AnswerStats(method="draft", enabled=True, completion_tokens=5).to_dict(),
             "note": "x"}
    model = MessageListModel()
    model.reset([message(1), message(2, "assistant", "boom", ERROR, stats),
                 message(3, "system", "hidden")])
    assert len(model.items) == 2
    assert model.items[1].stats is not None and model.items[1].stats.method == "draft"
    assert model.items[1].note == "x"
    assert model.history() == [{"role": "user", "content": "hi"}]
    assert model.last("assistant") is model.items[1]


def test_conversation_model_orders_and_searches(qtmodeltester: ModelTester) -> None:
    now = time.time()
    model = ConversationListModel()
    model.reset([Conversation(1, "one", now, now), Conversation(2, "two", now, now - 90)])
    qtmodeltester.check(model)
    model.put_first(Conversation(2, "two", now, now))
    assert [c.id for c in model.items] == [2, 1]
    model.put_first(Conversation(3, "three", now, now))
    model.replace(Conversation(1, "renamed", now, now))
    model.remove(3)
    assert [model.data(model.index(i)) for i in range(2)] == ["two", "renamed"]
    assert model.data(model.index(0), Roles.SUBTITLE) == "just now"
    model.reset([Conversation(1, "one", now, now, snippet="a match")], searching=True)
    assert model.data(model.index(0), Roles.SUBTITLE) == "a match"
    qtmodeltester.check(model)


def test_when_is_short_and_human() -> None:
    now = time.time()
    assert when(now - 5, now) == "just now"
    assert when(now - 600, now) == "10 min ago"
    assert when(now - 3 * 86400, now).split()[1].isalpha()


def test_recent_answers_keep_the_latest(qtmodeltester: ModelTester) -> None:
    model = RecentAnswersModel(capacity=3)
    model.reset([AnswerStats(completion_tokens=i) for i in range(5)])
    assert [s.completion_tokens for s in model.items] == [2, 3, 4]
    model.add(AnswerStats(completion_tokens=9))
    assert [s.completion_tokens for s in model.items] == [3, 4, 9]
    qtmodeltester.check(model)


def test_demo_runs_newest_first(qtmodeltester: ModelTester) -> None:
    side = {"text": "x", "stats": {}, "timeline": []}
    slow = {"text": "x", "stats": {"completion_tokens": 4, "total_s": 2.0}, "timeline": []}
    fast = {"text": "x", "stats": {"completion_tokens": 4, "total_s": 1.0}, "timeline": []}
    old = DemoRun(1, 0.0, "old prompt", "draft", slow, fast, True, None, 2.0)
    new = DemoRun(2, 1.0, "new prompt " * 10, "ngram", side, side, False, 3, None)
    model = DemoRunListModel()
    model.reset([old])
    model.prepend(new)
    qtmodeltester.check(model)
    assert "n-gram lookup" in model.data(model.index(0)) and "outputs differ" in summary(new)
    assert "2.00× faster" in summary(old) and "identical" in summary(old)  # end to end
    assert "speed not measured" in summary(new)
