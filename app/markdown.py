"""Split answer text into Markdown prose and fenced code blocks. No Qt here.

Contract: :func:`split_blocks` cuts text at fenced code blocks (```` ``` ```` or
``~~~``, up to three spaces of indent, closed by a fence of the same character at
least as long) and prose at blank lines into paragraphs of at most
:data:`MAX_PARAGRAPH` characters (longer ones are cut at a line break or a space), so
a view re-renders only the last, short block while an answer streams. A code block
still open at the end (an answer that is streaming) has ``closed=False``.
Concatenating the blocks' ``source`` gives the input back. :func:`draft_html`
renders text with accepted-draft pieces highlighted; :func:`highlighted_blocks` does
it per block (kind ``html``) so long answers stay cheap to update.
"""

import html
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MAX_PARAGRAPH = 1500
BLANK_LINE = re.compile(r"\n[ \t]*\n")
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)[^`]*$")


@dataclass(frozen=True)
class Block:
    kind: str  # "text" or "code"
    text: str  # prose Markdown, or the code without its fences
    language: str = ""
    closed: bool = True
    source: str = ""  # the exact input lines of this block


def _closes(line: str, fence: str) -> bool:
    stripped = line.strip()
    return (
        len(line) - len(line.lstrip(" ")) <= 3
        and stripped.startswith(fence[0] * len(fence))
        and set(stripped) == {fence[0]}
    )


def split_blocks(markdown: str) -> list[Block]:
    """Prose and code blocks in order; empty prose between blocks is dropped."""
    blocks: list[Block] = []
    prose: list[str] = []
    lines = markdown.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i].rstrip("\n"))
        if match is None:
            prose.append(lines[i])
            i += 1
            continue
        _flush(blocks, prose)
        fence, language = match.group(1), match.group(2)
        end = next((j for j in range(i + 1, len(lines)) if _closes(lines[j], fence)), None)
        body = lines[i + 1 : len(lines) if end is None else end]
        source = "".join(lines[i : len(lines) if end is None else end + 1])
        code = "".join(body).removesuffix("\n")
        blocks.append(Block("code", code, language, end is not None, source))
        i = len(lines) if end is None else end + 1
    _flush(blocks, prose)
    return blocks


def extend_blocks(previous: list[Block], text: str) -> list[Block]:
    """``split_blocks(text)`` for text that grew: only the last block onwards is re-split.

    Blocks end at a blank line or a closing fence, so everything before the previous
    last block is unchanged when ``text`` still starts with it (the streaming case).
    """
    if len(previous) < 2:
        return split_blocks(text)
    kept = previous[:-1]
    prefix = sum(len(b.source) for b in kept)
    if not text.startswith("".join(b.source for b in kept)) or not kept[-1].closed:
        return split_blocks(text)
    return kept + split_blocks(text[prefix:])


def _flush(blocks: list[Block], prose: list[str]) -> None:
    text = "".join(prose)
    prose.clear()
    start = 0
    for match in BLANK_LINE.finditer(text):
        _add_prose(blocks, text[start : match.end()])
        start = match.end()
    _add_prose(blocks, text[start:])


def _add_prose(blocks: list[Block], source: str) -> None:
    """Add one paragraph (cut when too long), or glue blank text to the previous block."""
    while len(source) > MAX_PARAGRAPH:
        cut = _cut_point(source)
        _add_prose(blocks, source[:cut])
        source = source[cut:]
    if source.strip():
        blocks.append(Block("text", source.strip("\n"), source=source))
    elif blocks and source:
        last = blocks[-1]
        blocks[-1] = Block(last.kind, last.text, last.language, last.closed, last.source + source)
    elif source:
        blocks.append(Block("text", "", source=source))


def _cut_point(source: str) -> int:
    """Where to cut a paragraph longer than :data:`MAX_PARAGRAPH`."""
    for separator in ("\n", " "):
        cut = source.rfind(separator, MAX_PARAGRAPH // 2, MAX_PARAGRAPH)
        if cut > 0:
            return cut + 1
    return MAX_PARAGRAPH


def draft_html(pieces: Sequence[Sequence[Any]], highlight: str, code: bool = False) -> str:
    """Plain text as HTML, with text from accepted draft tokens on ``highlight``
    (``code``: in a monospace font, lines not wrapped)."""
    spans = []
    for text, from_draft in pieces:
        escaped = html.escape(str(text)).replace("\n", "<br>")
        if from_draft:
            spans.append(f'<span style="background-color:{highlight};">{escaped}</span>')
        else:
            spans.append(escaped)
    style = "font-family: monospace; white-space: pre;" if code else "white-space: pre-wrap;"
    return f'<div style="{style}">{"".join(spans)}</div>'


def highlighted_blocks(
    text: str, pieces: Sequence[Sequence[Any]], highlight: str
) -> list[Block]:
    """The blocks of :func:`split_blocks`, each as highlighted HTML (kind ``html``).

    Fenced code is shown without its fences in a monospace font (no code box).
    Returns [] when the pieces do not spell the text (then there is nothing to
    highlight).
    """
    flags = [bool(flag) for piece, flag in pieces for _ in str(piece)]
    if "".join(str(piece) for piece, _ in pieces) != text:
        return []
    blocks, pos = [], 0
    for block in split_blocks(text):
        end = pos + len(block.source)
        if block.kind == "code":
            lead, shown = max(0, block.source.find(block.text)), block.text
        else:
            lead = len(block.source) - len(block.source.lstrip("\n"))
            shown = block.source.strip("\n")
        runs: list[list[Any]] = []
        for offset, char in enumerate(shown):
            flag = flags[pos + lead + offset]
            if runs and runs[-1][1] == flag:
                runs[-1][0] += char
            else:
                runs.append([char, flag])
        if shown:
            html = draft_html(runs, highlight, code=block.kind == "code")
            blocks.append(Block("html", html, source=block.source))
        pos = end
    return blocks
