"""The history store without Qt or a worker: schema, records, search, safety."""

import asyncio
import os
import signal
import sqlite3
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from app.store import (
    COMPLETE,
    INTERRUPTED,
    MIGRATIONS,
    SCHEMA_VERSION,
    AsyncStore,
    ChatSettings,
    Store,
    StoreError,
    fts_query,
    title_from,
)
from tests.worker_process import REPO


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store.open(tmp_path / "history.sqlite3")


def test_file_is_private_wal_and_current(tmp_path: Path, store: Store) -> None:
    path = tmp_path / "history.sqlite3"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store.version == SCHEMA_VERSION
    assert store.integrity_check() == "ok"
    assert {"conversations", "messages", "settings", "demo_runs", "messages_fts"} <= set(
        store.db.table_names()
    )


def test_migrates_an_older_file_and_keeps_its_data(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    store = Store.open(path)
    conversation = store.create_conversation("kept")
    store.db.execute("DROP TABLE demo_runs")
    store.db.execute("PRAGMA user_version = 1")
    store.close()
    reopened = Store.open(path)
    assert reopened.version == SCHEMA_VERSION == len(MIGRATIONS)
    assert [c.title for c in reopened.conversations()] == ["kept"]
    assert reopened.conversation(conversation.id).title == "kept"
    assert reopened.demo_runs() == []


def test_refuses_a_file_from_a_newer_app(tmp_path: Path) -> None:
    path = tmp_path / "new.sqlite3"
    Store.open(path).db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(StoreError, match="newer ANVE"):
        Store.open(path)


class Clock:
    """Stands in for the ``time`` module in :mod:`app.store`: each reading is a second
    after the one before, however fast the calls come."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def time(self) -> float:
        self.now += 1.0
        return self.now


def test_conversations_newest_first_rename_and_settings(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("app.store.time", Clock())
    first = store.create_conversation("first")
    second = store.create_conversation("second", ChatSettings("Be brief.", 0.2, 64))
    assert [c.title for c in store.conversations()] == ["second", "first"]
    store.add_message(first.id, "user", "hello again")
    assert [c.title for c in store.conversations()] == ["first", "second"]
    store.rename(first.id, "renamed")
    store.set_settings(first.id, ChatSettings("Talk like a pirate.", 1.1, 100))
    again = store.conversation(first.id)
    assert again.title == "renamed"
    assert again.settings == ChatSettings("Talk like a pirate.", 1.1, 100)
    assert store.conversation(second.id).settings.max_tokens == 64


def test_settings_json_is_tolerant() -> None:
    assert ChatSettings.from_json("not json") == ChatSettings()
    parsed = ChatSettings.from_json('{"temperature": 1, "max_tokens": "x", "other": 3}')
    assert parsed == ChatSettings(temperature=1.0)


def test_messages_stream_then_finalise(store: Store) -> None:
    conversation = store.create_conversation("c")
    question = store.add_message(conversation.id, "user", "What is 2 + 2?")
    answer = store.add_message(conversation.id, "assistant", "", INTERRUPTED)
    store.update_message(answer.id, "It is")
    assert store.message(answer.id).status == INTERRUPTED
    store.update_message(answer.id, "It is 4.", status=COMPLETE,
                         stats={"measured": {"method": "draft"}}, pieces=[["It is", True]])
    messages = store.messages(conversation.id)
    assert [m.id for m in messages] == [question.id, answer.id]
    assert messages[1].content == "It is 4."
    assert messages[1].status == COMPLETE
    assert messages[1].stats == {"measured": {"method": "draft"}}
    assert messages[1].pieces == [["It is", True]]
    assert store.recent_stats() == [{"measured": {"method": "draft"}}]


def test_truncate_removes_a_message_and_what_follows(store: Store) -> None:
    conversation = store.create_conversation("c")
    ids = [store.add_message(conversation.id, role, text).id
           for role, text in [("user", "a"), ("assistant", "b"), ("user", "c"),
                              ("assistant", "d")]]
    store.truncate(conversation.id, ids[2])
    assert [m.content for m in store.messages(conversation.id)] == ["a", "b"]


def test_delete_undo_and_purge(store: Store) -> None:
    keep = store.create_conversation("keep")
    gone = store.create_conversation("gone")
    store.add_message(gone.id, "user", "unique zebra words")
    store.delete(gone.id)
    assert [c.title for c in store.conversations()] == ["keep"]
    assert store.search("zebra") == []
    store.undelete(gone.id)
    assert store.search("zebra")[0].id == gone.id
    store.delete(gone.id)
    assert store.purge_deleted() == 1
    assert store.db.execute("SELECT count(*) FROM messages").fetchone()[0] == 0
    assert [c.id for c in store.conversations()] == [keep.id]


def test_search_finds_words_by_prefix_across_conversations(store: Store) -> None:
    a = store.create_conversation("budget")
    b = store.create_conversation("heating")
    store.add_message(a.id, "user", "What is the IT budget for the second quarter?")
    store.add_message(b.id, "user", "When is the heating switched off on floor three?")
    store.add_message(b.id, "assistant", "On Tuesday and Wednesday from 8:00 to 14:00.")
    assert [c.id for c in store.search("heat")] == [b.id]
    assert [c.id for c in store.search("tuesday 14")] == [b.id]
    hit = store.search("quarter")[0]
    assert hit.id == a.id and "quarter" in hit.snippet
    assert store.search('"; DROP TABLE messages; --') == []
    assert store.search("   ") == []
    assert fts_query('say "hi" (now)') == '"say"* "hi"* "now"*'


def test_settings_and_demo_runs(store: Store) -> None:
    assert store.setting("missing", 7) == 7
    store.set_setting("admin_passphrase", "scrypt$x")
    store.set_setting("admin_passphrase", "scrypt$y")
    assert store.setting("admin_passphrase") == "scrypt$y"
    side = {"text": "hi", "stats": {}, "timeline": [[0.1, "hi"]]}
    run = store.add_demo_run("prompt", "draft", side, side, True, None, 2.5)
    assert store.demo_runs() == [run]
    assert store.demo_runs()[0].plain["timeline"] == [[0.1, "hi"]]


def test_answered_chats_are_what_the_model_saw_newest_within_the_budget(store: Store) -> None:
    def chat(title: str, answer: str, prompt: str = "", status: str = COMPLETE) -> int:
        c = store.create_conversation(title, ChatSettings(system_prompt=prompt))
        store.add_message(c.id, "user", f"about {title}")
        store.add_message(c.id, "assistant", answer, status=status)
        return c.id

    chat("old", "x" * 50)
    chat("cut", "half an answer", status=INTERRUPTED)  # no complete answer: left out
    gone = chat("deleted", "never sent")
    store.delete(gone)
    chat("new", "yes", prompt="Be brief.")
    assert store.answered_chats(10_000) == [
        [{"role": "user", "content": "about old"}, {"role": "assistant", "content": "x" * 50}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "about new"},
         {"role": "assistant", "content": "yes"}],
    ]
    assert [c[-1]["content"] for c in store.answered_chats(40)] == ["yes"]  # newest first in


def test_title_from_first_question() -> None:
    assert title_from("  Hello\n there ") == "Hello there"
    assert len(title_from("word " * 40)) <= 48
    assert title_from("word " * 40).endswith("…")


def test_async_store_runs_calls_on_one_thread(tmp_path: Path) -> None:
    db = AsyncStore(Store.open(tmp_path / "h.sqlite3"))

    async def work() -> list[str]:
        conversation = await db.call(Store.create_conversation, "async")
        await asyncio.gather(*[
            db.call(Store.add_message, conversation.id, "user", f"m{i}") for i in range(20)
        ])
        return [m.content for m in await db.call(Store.messages, conversation.id)]

    assert asyncio.run(work()) == [f"m{i}" for i in range(20)]
    db.close()


KILLED_WRITER = """
import sys
from app.store import Store, INTERRUPTED
store = Store.open(sys.argv[1])
c = store.create_conversation("crash")
store.add_message(c.id, "user", "the question")
answer = store.add_message(c.id, "assistant", "", INTERRUPTED)
text = "partial answer words "
store.update_message(answer.id, text)
print("ready", flush=True)  # one update is in; the writer goes on until it is killed
while True:
    text += "partial answer words "
    store.update_message(answer.id, text)
"""


def test_a_killed_app_leaves_a_valid_database(tmp_path: Path) -> None:
    path = tmp_path / "crash.sqlite3"
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(KILLED_WRITER), str(path)],
        cwd=REPO, stdout=subprocess.PIPE, text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    os.kill(proc.pid, signal.SIGKILL)  # mid-write: it writes as fast as it can
    proc.wait(10)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    rows = conn.execute("SELECT role, content, status FROM messages ORDER BY id").fetchall()
    conn.close()
    assert rows[0] == ("user", "the question", "complete")
    assert rows[1][0] == "assistant" and rows[1][1].startswith("partial answer")
    assert rows[1][2] == INTERRUPTED


def test_data_dir_follows_anve_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from app.paths import data_dir, database_path

    monkeypatch.setenv("ANVE_DATA_DIR", str(tmp_path / "anve-data"))
    assert data_dir() == tmp_path / "anve-data" and data_dir().is_dir()
    assert database_path().parent == tmp_path / "anve-data"
