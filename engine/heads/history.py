"""The office's past chats, read straight from the app's SQLite history file.

Contract: :func:`conversations` opens the database read-only (the engine never imports
the app and never writes its history) and returns each non-deleted conversation's
complete messages in order, as chat message lists, keeping only conversations that hold
at least one complete assistant answer. Nothing is sent anywhere.
"""

import sqlite3
from pathlib import Path

from engine.errors import BadRequestError

QUERY = """
    SELECT m.conversation_id, m.role, m.content
    FROM messages m JOIN conversations c ON c.id = m.conversation_id
    WHERE c.deleted IS NULL AND m.status = 'complete' AND m.content != ''
    ORDER BY m.conversation_id, m.id
"""


def conversations(db: Path) -> list[list[dict[str, str]]]:
    """Complete conversations of the history database ``db`` (read-only)."""
    if not db.is_file():
        raise BadRequestError(f"no history database at {db}")
    try:
        conn = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)
        try:
            rows = conn.execute(QUERY).fetchall()
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise BadRequestError(f"cannot read the history database {db}: {exc}") from exc
    grouped: dict[int, list[dict[str, str]]] = {}
    for conversation, role, content in rows:
        grouped.setdefault(conversation, []).append({"role": role, "content": content})
    return [m for m in grouped.values() if any(x["role"] == "assistant" for x in m)]
