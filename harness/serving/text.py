"""Turn a growing list of output token ids into text deltas, as they stream.

A token can end in the middle of a multi-byte character, and a tokenizer may join tokens
with spaces that depend on their neighbours, so each delta is decoded from a small window of
recent tokens: the text of `ids[start:]` minus the text of `ids[start:read]` (what was already
sent). A window whose text ends in U+FFFD (an incomplete character) waits for the next token.
Special tokens (the end-of-sequence token) are left out of the text, but not of the ids.
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

REPLACEMENT = "\ufffd"


class TextStream:
    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self._tokenizer = tokenizer
        self.ids: list[int] = []
        self._start = 0  # first token of the decoding window
        self._read = 0  # tokens whose text was sent

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=True)

    def add(self, ids: list[int]) -> str:
        """Append tokens; the new text they complete (possibly empty)."""
        self.ids += ids
        return self._advance(final=False)

    def flush(self) -> str:
        """The text still held back at the end of the response."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        sent = self._decode(self.ids[self._start : self._read])
        text = self._decode(self.ids[self._start :])
        if len(text) <= len(sent) or (text.endswith(REPLACEMENT) and not final):
            return ""
        self._start, self._read = self._read, len(self.ids)
        return text[len(sent) :]
