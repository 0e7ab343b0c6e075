"""Chat history in one SQLite file, through sqlite-utils. No Qt here.

Contract:

* :meth:`Store.open` creates the file with mode 0600, switches to WAL, and migrates
  the schema to :data:`SCHEMA_VERSION` (``PRAGMA user_version``); a file written by a
  newer app is refused with :class:`StoreError`.
* Tables: ``conversations`` (title, settings JSON, soft-delete mark for undo),
  ``messages`` (role, content, created, status, stats JSON, draft pieces JSON),
  ``settings`` (key → JSON value), ``demo_runs``; ``messages_fts`` is the FTS5 index
  over message text, kept current by triggers. Ids are never reused (AUTOINCREMENT).
* Message status is ``complete``, ``interrupted`` or ``error``. An answer is stored as
  ``interrupted`` while it streams (or is continued) and becomes ``complete`` when it
  ends, so a crash mid-answer leaves the question and the partial answer, correctly
  marked. An answer's stats JSON holds ``measured`` (:class:`app.answer.AnswerStats`),
  ``outcome``, the ``note`` shown under it and, for one cut at its token limit, the
  ``limit``.
* A :class:`Store` is not thread-safe: the app touches it from one executor thread
  only (:class:`AsyncStore`); tests call it directly.
"""

import asyncio
import functools
import json
import logging
import os
import re
import sqlite3
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

import sqlite_utils

from engine.protocol import CONTEXT_OVERFLOW, ROLLING_WINDOW

log = logging.getLogger(__name__)

COMPLETE, INTERRUPTED, ERROR = "complete", "interrupted", "error"
STATUSES = (COMPLETE, INTERRUPTED, ERROR)
DEFAULT_SYSTEM_PROMPT = "You are ANVE, a helpful office assistant. Answer clearly and concisely."
TITLE_CHARS = 48


class StoreError(Exception):
    """The history file cannot be used; the message says why."""


# --- records ------------------------------------------------------------------------


@dataclass(frozen=True)
class ChatSettings:
    """Per-conversation generation settings. ``context_overflow`` says what happens when
    the conversation outgrows the model's context: ``rolling_window`` leaves out its
    oldest messages (the system prompt and the latest question stay), ``stop`` refuses
    the question with a message."""

    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    temperature: float = 0.7
    max_tokens: int = 512
    context_overflow: str = ROLLING_WINDOW

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str | None) -> "ChatSettings":
        """Parse stored settings; unknown keys are ignored, bad values take defaults."""
        try:
            data = json.loads(text or "{}")
        except ValueError:
            data = {}
        known = {f.name: f.type for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known} if isinstance(data, dict) else {}
        settings = cls()
        if values.get("context_overflow", ROLLING_WINDOW) not in CONTEXT_OVERFLOW:
            del values["context_overflow"]
        for name, value in values.items():
            default = getattr(settings, name)
            if isinstance(value, type(default)) or (
                isinstance(default, float) and isinstance(value, int)
            ):
                settings = replace(settings, **{name: type(default)(value)})
        return settings


@dataclass(frozen=True)
class Conversation:
    id: int
    title: str
    created: float
    updated: float
    settings: ChatSettings = field(default_factory=ChatSettings)
    snippet: str = ""  # the matching text when found by search


@dataclass(frozen=True)
class Message:
    id: int
    conversation_id: int
    role: str
    content: str
    created: float
    status: str = COMPLETE
    stats: dict[str, Any] | None = None
    pieces: list[list[Any]] | None = None  # [[text, from_draft], ...] of an answer


@dataclass(frozen=True)
class DemoRun:
    """One side-by-side demo: each side is {text, stats, timeline}."""

    id: int
    created: float
    prompt: str
    method: str
    plain: dict[str, Any]
    speculative: dict[str, Any]
    identical: bool
    first_difference: int | None
    speedup: float | None


# --- schema ---------------------------------------------------------------------------


def _schema_v1(db: sqlite_utils.Database) -> None:
    db.executescript("""
        CREATE TABLE conversations (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            title TEXT NOT NULL,
            created REAL NOT NULL,
            updated REAL NOT NULL,
            settings TEXT NOT NULL DEFAULT '{}',
            deleted REAL
        );
        CREATE TABLE messages (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
            role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
            content TEXT NOT NULL DEFAULT '',
            created REAL NOT NULL,
            status TEXT NOT NULL DEFAULT 'complete'
                CHECK (status IN ('complete', 'interrupted', 'error')),
            stats TEXT,
            pieces TEXT
        );
        CREATE INDEX messages_by_conversation ON messages (conversation_id, id);
        CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    """)
    db.table("messages").enable_fts(["content"], create_triggers=True)


def _schema_v2(db: sqlite_utils.Database) -> None:
    db.executescript("""
        CREATE TABLE demo_runs (
            id INTEGER PRIMARY KEY,
            created REAL NOT NULL,
            prompt TEXT NOT NULL,
            method TEXT NOT NULL,
            plain TEXT NOT NULL,
            speculative TEXT NOT NULL,
            identical INTEGER NOT NULL,
            first_difference INTEGER,
            speedup REAL
        );
    """)


MIGRATIONS: tuple[Callable[[sqlite_utils.Database], None], ...] = (_schema_v1, _schema_v2)
SCHEMA_VERSION = len(MIGRATIONS)


def _create_private(path: Path) -> None:
    """Create the database file readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.close(os.open(path, os.O_CREAT | os.O_RDWR, 0o600))
    os.chmod(path, 0o600)


def fts_query(text: str) -> str:
    """A safe FTS5 prefix query: every word must occur (``"word"*``)."""
    words = re.findall(r"\w+", text)
    return " ".join(f'"{w}"*' for w in words)


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value)


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


# --- the store --------------------------------------------------------------------------


class Store:
    """The history database."""

    def __init__(self, db: sqlite_utils.Database, path: Path | None) -> None:
        self.db = db
        self.path = path

    @classmethod
    def open(cls, path: Path | str) -> "Store":
        path = Path(path)
        _create_private(path)
        conn = sqlite3.connect(path, check_same_thread=False)
        store = cls(sqlite_utils.Database(conn, execute_plugins=False), path)
        store._prepare()
        return store

    @classmethod
    def memory(cls) -> "Store":
        conn = sqlite3.connect(":memory:", check_same_thread=False)
        store = cls(sqlite_utils.Database(conn, execute_plugins=False), None)
        store._prepare()
        return store

    def _prepare(self) -> None:
        self.db.execute("PRAGMA foreign_keys = ON")
        if self.path is not None:
            self.db.enable_wal()
            self.db.execute("PRAGMA synchronous = NORMAL")
        self.migrate()

    @property
    def version(self) -> int:
        return int(self.db.execute("PRAGMA user_version").fetchone()[0])

    def migrate(self) -> None:
        """Bring the schema to :data:`SCHEMA_VERSION`, one transaction per step."""
        version = self.version
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"the history file {self.path} was written by a newer ANVE "
                f"(schema {version}, this app knows {SCHEMA_VERSION})"
            )
        for number, step in enumerate(MIGRATIONS[version:], start=version + 1):
            with self.db.conn:
                step(self.db)
                self.db.execute(f"PRAGMA user_version = {number}")
            log.info("history schema migrated to version %d", number)

    def close(self) -> None:
        self.db.close()

    def integrity_check(self) -> str:
        return str(self.db.execute("PRAGMA integrity_check").fetchone()[0])

    # --- conversations ------------------------------------------------------------

    def create_conversation(
        self, title: str, settings: ChatSettings | None = None
    ) -> Conversation:
        now = time.time()
        settings = settings or ChatSettings()
        with self.db.conn:
            table = self.db.table("conversations").insert({
                "title": title, "created": now, "updated": now, "settings": settings.to_json(),
            })
        return Conversation(int(table.last_pk or 0), title, now, now, settings)

    def conversations(self) -> list[Conversation]:
        """Conversations not deleted, most recently active first."""
        rows = self.db.query(
            "SELECT * FROM conversations WHERE deleted IS NULL ORDER BY updated DESC, id DESC"
        )
        return [self._conversation(row) for row in rows]

    def conversation(self, conversation_id: int) -> Conversation:
        return self._conversation(self.db.table("conversations").get(conversation_id))

    @staticmethod
    def _conversation(row: dict[str, Any], snippet: str = "") -> Conversation:
        return Conversation(
            row["id"], row["title"], row["created"], row["updated"],
            ChatSettings.from_json(row["settings"]), snippet,
        )

    def rename(self, conversation_id: int, title: str) -> None:
        with self.db.conn:
            self.db.table("conversations").update(conversation_id, {"title": title})

    def set_settings(self, conversation_id: int, settings: ChatSettings) -> None:
        with self.db.conn:
            self.db.table("conversations").update(conversation_id, {"settings": settings.to_json()})

    def touch(self, conversation_id: int) -> None:
        with self.db.conn:
            self.db.table("conversations").update(conversation_id, {"updated": time.time()})

    def delete(self, conversation_id: int) -> None:
        """Hide a conversation; :meth:`undelete` brings it back until it is purged."""
        with self.db.conn:
            self.db.table("conversations").update(conversation_id, {"deleted": time.time()})

    def undelete(self, conversation_id: int) -> None:
        with self.db.conn:
            self.db.table("conversations").update(conversation_id, {"deleted": None})

    def purge_deleted(self) -> int:
        """Remove hidden conversations and their messages for good."""
        with self.db.conn:
            cursor = self.db.execute("DELETE FROM conversations WHERE deleted IS NOT NULL")
        return cursor.rowcount

    # --- messages -----------------------------------------------------------------------

    def add_message(
        self, conversation_id: int, role: str, content: str, status: str = COMPLETE,
        stats: dict[str, Any] | None = None,
    ) -> Message:
        now = time.time()
        row = {"conversation_id": conversation_id, "role": role, "content": content,
               "created": now, "status": status, "stats": _json(stats), "pieces": None}
        with self.db.conn:
            table = self.db.table("messages").insert(row)
            self.db.table("conversations").update(conversation_id, {"updated": now})
        return Message(int(table.last_pk or 0), conversation_id, role, content, now, status, stats)

    def update_message(
        self, message_id: int, content: str, *, status: str | None = None,
        stats: dict[str, Any] | None = None, pieces: Sequence[Sequence[Any]] | None = None,
    ) -> None:
        """Save an answer's text so far, and optionally its status, stats and pieces."""
        updates: dict[str, Any] = {"content": content}
        if status is not None:
            updates["status"] = status
        if stats is not None:
            updates["stats"] = _json(stats)
        if pieces is not None:
            updates["pieces"] = _json([list(p) for p in pieces])
        with self.db.conn:
            self.db.table("messages").update(message_id, updates)

    def set_note(self, message_id: int, note: str) -> None:
        """Change the note stored with an answer (what the app later learnt about it)."""
        with self.db.conn:
            row = self.db.execute("SELECT stats FROM messages WHERE id = ?",
                                  [message_id]).fetchone()
            if row is None:
                return
            stats = _loads(row[0]) or {}
            stats["note"] = note
            self.db.table("messages").update(message_id, {"stats": _json(stats)})

    def messages(self, conversation_id: int) -> list[Message]:
        rows = self.db.table("messages").rows_where(
            "conversation_id = ?", [conversation_id], order_by="id"
        )
        return [self._message(row) for row in rows]

    def message(self, message_id: int) -> Message:
        return self._message(self.db.table("messages").get(message_id))

    @staticmethod
    def _message(row: dict[str, Any]) -> Message:
        return Message(
            row["id"], row["conversation_id"], row["role"], row["content"], row["created"],
            row["status"], _loads(row["stats"]), _loads(row["pieces"]),
        )

    def truncate(self, conversation_id: int, from_message_id: int) -> None:
        """Delete a message and everything after it (regenerate, edit and resend)."""
        with self.db.conn:
            self.db.execute(
                "DELETE FROM messages WHERE conversation_id = ? AND id >= ?",
                [conversation_id, from_message_id],
            )

    def recent_stats(self, limit: int = 30) -> list[dict[str, Any]]:
        """Stats of the latest finished answers, oldest first."""
        rows = self.db.query(
            "SELECT stats FROM messages WHERE role = 'assistant' AND status = 'complete' "
            "AND stats IS NOT NULL ORDER BY id DESC LIMIT ?", [limit],
        )
        return [json.loads(row["stats"]) for row in rows][::-1]

    def answered_chats(self, max_chars: int) -> list[list[dict[str, str]]]:
        """The newest chats with a complete answer, as the model saw them, oldest first.

        Each is ``[{"role", "content"}, ...]``: its system prompt (if any) and its complete
        messages; deleted chats are left out. Stops before ``max_chars`` of text.
        """
        chats: list[list[dict[str, str]]] = []
        total = 0
        for conversation in self.conversations():  # newest first
            chat = [{"role": m.role, "content": m.content}
                    for m in self.messages(conversation.id)
                    if m.status == COMPLETE and m.content]
            if not any(m["role"] == "assistant" for m in chat):
                continue
            if conversation.settings.system_prompt:
                chat.insert(0, {"role": "system", "content": conversation.settings.system_prompt})
            total += sum(len(m["content"]) for m in chat)
            if total > max_chars:
                break
            chats.append(chat)
        return chats[::-1]

    def search(self, text: str, limit: int = 50) -> list[Conversation]:
        """Conversations whose messages match every word of ``text`` (prefixes), best first."""
        query = fts_query(text)
        if not query:
            return []
        rows = self.db.query(
            "SELECT c.*, snippet(messages_fts, 0, '', '', '…', 12) AS snippet "
            "FROM messages_fts JOIN messages m ON m.id = messages_fts.rowid "
            "JOIN conversations c ON c.id = m.conversation_id "
            "WHERE messages_fts MATCH ? AND c.deleted IS NULL ORDER BY rank LIMIT ?",
            [query, limit * 4],
        )
        found: dict[int, Conversation] = {}
        for row in rows:
            if row["id"] not in found:
                found[row["id"]] = self._conversation(row, " ".join(row["snippet"].split()))
        return list(found.values())[:limit]

    # --- settings ---------------------------------------------------------------------

    def setting(self, key: str, default: Any = None) -> Any:
        row = self.db.execute("SELECT value FROM settings WHERE key = ?", [key]).fetchone()
        return default if row is None else json.loads(row[0])

    def set_setting(self, key: str, value: Any) -> None:
        with self.db.conn:
            self.db.table("settings").upsert({"key": key, "value": json.dumps(value)}, pk="key")

    # --- demo runs ---------------------------------------------------------------------

    def add_demo_run(
        self, prompt: str, method: str, plain: dict[str, Any], speculative: dict[str, Any],
        identical: bool, first_difference: int | None, speedup: float | None,
    ) -> DemoRun:
        now = time.time()
        row = {"created": now, "prompt": prompt, "method": method, "plain": json.dumps(plain),
               "speculative": json.dumps(speculative), "identical": int(identical),
               "first_difference": first_difference, "speedup": speedup}
        with self.db.conn:
            table = self.db.table("demo_runs").insert(row)
        return DemoRun(int(table.last_pk or 0), now, prompt, method, plain, speculative, identical,
                       first_difference, speedup)

    def demo_runs(self, limit: int = 100) -> list[DemoRun]:
        rows = self.db.query("SELECT * FROM demo_runs ORDER BY id DESC LIMIT ?", [limit])
        return [
            DemoRun(r["id"], r["created"], r["prompt"], r["method"], json.loads(r["plain"]),
                    json.loads(r["speculative"]), bool(r["identical"]), r["first_difference"],
                    r["speedup"])
            for r in rows
        ]


def title_from(text: str) -> str:
    """A conversation title from its first question."""
    line = " ".join(text.split())
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1].rstrip() + "…"


# --- one thread for the database ------------------------------------------------------

P = ParamSpec("P")
T = TypeVar("T")


class AsyncStore:
    """Runs :class:`Store` methods on one dedicated thread, awaitable from the event loop."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="anve-store")

    async def call(
        self, method: Callable[Concatenate[Store, P], T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """``await db.call(Store.add_message, conversation_id, "user", text)``."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._pool, functools.partial(method, self.store, *args, **kwargs)
        )

    def close(self) -> None:
        """Wait for pending writes, then close the database."""
        self._pool.submit(self.store.close).result()
        self._pool.shutdown()
