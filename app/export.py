"""Export a conversation as Markdown or JSON. No Qt here.

Contract: :func:`to_markdown` writes a readable document (title, system prompt, one
section per message, answer statistics in italics); :func:`to_json` writes everything
stored, with ISO timestamps, so another tool can read it back.
"""

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from app.answer import footer_text, stored_stats
from app.store import COMPLETE, Conversation, Message

ROLE_TITLES = {"user": "You", "assistant": "ANVE", "system": "System"}
FORMATS = {"markdown": ".md", "json": ".json"}


def _iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="seconds")


def to_markdown(conversation: Conversation, messages: Sequence[Message]) -> str:
    lines = [f"# {conversation.title}", "", f"*Exported from ANVE, started "
             f"{_iso(conversation.created)}*", ""]
    if conversation.settings.system_prompt:
        lines += [f"> System prompt: {conversation.settings.system_prompt}", ""]
    for message in messages:
        lines += [f"## {ROLE_TITLES.get(message.role, message.role)}", "", message.content, ""]
        stats = stored_stats(message.stats)
        if message.status != COMPLETE:
            lines += [f"*({message.status})*", ""]
        if stats is not None:
            lines += [f"*{footer_text(stats)}*", ""]
    return "\n".join(lines).rstrip() + "\n"


def to_json(conversation: Conversation, messages: Sequence[Message]) -> str:
    document: dict[str, Any] = {
        "title": conversation.title,
        "created": _iso(conversation.created),
        "settings": {
            "system_prompt": conversation.settings.system_prompt,
            "temperature": conversation.settings.temperature,
            "max_tokens": conversation.settings.max_tokens,
        },
        "messages": [
            {"role": m.role, "content": m.content, "created": _iso(m.created),
             "status": m.status, "stats": m.stats}
            for m in messages
        ],
    }
    return json.dumps(document, ensure_ascii=False, indent=2) + "\n"


def render(fmt: str, conversation: Conversation, messages: Sequence[Message]) -> str:
    if fmt == "markdown":
        return to_markdown(conversation, messages)
    if fmt == "json":
        return to_json(conversation, messages)
    raise ValueError(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}")
