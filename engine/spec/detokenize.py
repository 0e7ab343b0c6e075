"""Incremental detokenization: token ids in, new text out, one token at a time.

Decoding the whole answer after every token is quadratic, and decoding tokens one by
one breaks multi-byte characters and words whose spacing depends on the previous
token. Like vLLM and TGI, we decode a short window twice (with and without the new
tokens) and emit the difference, holding text back while it ends in an incomplete
UTF-8 sequence (the replacement character). Seeded with the ids of text already shown
(an answer being continued), it emits only what follows them.
"""

from collections.abc import Sequence
from typing import Any

SEED_WINDOW = 5  # ids of the seed decoded again with the first new ones (vLLM's offset)


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas."""

    def __init__(self, tokenizer: Any, seed: Sequence[int] = ()) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = list(seed)
        self.prefix_offset = max(0, len(self.ids) - SEED_WINDOW)  # start of the decode window
        self.read_offset = len(self.ids)  # ids before this have had their text emitted

    def _decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    def add(self, token_id: int) -> str:
        """Append one id; return the text it completes (maybe empty)."""
        self.ids.append(token_id)
        prefix_text = self._decode(self.ids[self.prefix_offset : self.read_offset])
        new_text = self._decode(self.ids[self.prefix_offset :])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            return new_text[len(prefix_text) :]
        return ""

    def flush(self) -> str:
        """Text of ids still held back (an incomplete character at the very end)."""
        prefix_text = self._decode(self.ids[self.prefix_offset : self.read_offset])
        new_text = self._decode(self.ids[self.prefix_offset :])
        self.prefix_offset = self.read_offset = len(self.ids)
        return new_text[len(prefix_text) :]
