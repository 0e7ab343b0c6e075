"""Learning from the office's history: a head is trained, installed, and kept unless beaten."""

import sqlite3
from pathlib import Path

import pytest

from engine.errors import BadRequestError
from engine.heads import history, office
from engine.heads.files import find_head, read_info


def make_history(path: Path, conversations: int = 12) -> Path:
    conn = sqlite3.connect(path)
    conn.executescript("""
        CREATE TABLE conversations (id INTEGER PRIMARY KEY, title TEXT, created REAL,
                                    updated REAL, settings TEXT, deleted REAL);
        CREATE TABLE messages (id INTEGER PRIMARY KEY, conversation_id INTEGER, role TEXT,
                               content TEXT, created REAL, status TEXT, stats TEXT, pieces TEXT);
    """)
    for c in range(conversations + 1):
        deleted = 1.0 if c == conversations else None  # a deleted chat is never used
        conn.execute("INSERT INTO conversations VALUES (?, 't', 0, 0, '{}', ?)", (c, deleted))
        conn.execute("INSERT INTO messages (conversation_id, role, content, created, status) "
                     "VALUES (?, 'user', ?, 0, 'complete')", (c, f"Write function {c}."))
        answer = f"def f{c}(a, b):\n    return a + b * {c}\n" * 3
        conn.execute("INSERT INTO messages (conversation_id, role, content, created, status) "
                     "VALUES (?, 'assistant', ?, 0, 'complete')", (c, answer))
    conn.commit()
    conn.close()
    return path


def test_history_is_read_without_deleted_chats(tmp_path: Path) -> None:
    found = history.conversations(make_history(tmp_path / "h.db", 3))
    assert len(found) == 3 and [m["role"] for m in found[0]] == ["user", "assistant"]
    with pytest.raises(BadRequestError):
        history.conversations(tmp_path / "missing.db")


def test_office_installs_a_first_head_then_keeps_it_unless_beaten(
    tiny_folder: Path, tmp_path: Path
) -> None:
    db = make_history(tmp_path / "history.db")
    data = tmp_path / "data"
    argv = ["--target", str(tiny_folder), "--history", str(db), "--data-dir", str(data),
            "--steps", "6", "--tokens", "1200", "--seq-len", "32", "--held-out", "0.25"]
    assert office.main([*argv, "--lr", "3e-3"]) == 0
    installed = find_head(tiny_folder.name, data)
    assert installed is not None and installed.parent == data / "heads"
    assert read_info(installed).extra["corpus"] == "office history"
    before = installed.read_bytes()
    assert office.main([*argv, "--lr", "0"]) == office.KEPT  # unchanged head: not better
    assert installed.read_bytes() == before
