"""Token material for prompts: windows of real text, random ids that are not special.

`TextCorpus` holds the lines of the `prompts` section of the real text; a prompt of L
tokens is the window of L consecutive tokens from the start of a line (`TextWindows`),
so its content is real prose cut exactly to the drawn length.
`ordinary_ids` lists the vocabulary without the special tokens (`<|endoftext|>`,
`<|im_start|>`, ...), from which random prompts draw. `Prompt` is what every prompt source
produces.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from transformers import PreTrainedTokenizerBase

from servelab.base.errors import ConfigError
from servelab.workloads.text import text_section


@dataclass(frozen=True)
class Prompt:
    """A prompt's token ids and, where it has one, its text."""

    ids: tuple[int, ...]
    text: str | None = None


@dataclass(frozen=True)
class TextCorpus:
    """The lines of one text section and which of them are not blank."""

    lines: tuple[str, ...]
    starts: tuple[int, ...]  # indices of the non-blank lines, where windows may begin

    @staticmethod
    def of(section: str = "prompts") -> TextCorpus:
        lines = tuple(text_section(section).splitlines(keepends=True))
        return TextCorpus(lines=lines, starts=tuple(i for i, t in enumerate(lines) if t.strip()))


class TextWindows:
    """Token windows of a corpus, each from a line start not used before (until all are).

    Lines are tokenized one at a time, only when a window reaches them, so a workload costs
    tokenizer time in proportion to its prompts, not to the text. Starts come from a seeded
    permutation, so no two prompts of a workload begin at the same place (which would give
    them a common prefix by accident) unless it has more prompts than the text has lines.
    A window that runs past the last line continues from the first.
    """

    def __init__(
        self,
        corpus: TextCorpus,
        tokenizer: PreTrainedTokenizerBase,
        rng: np.random.Generator,
        field: str,
    ) -> None:
        self._corpus = corpus
        self._tokenizer = tokenizer
        self._order = rng.permutation(len(corpus.starts))
        self._taken = 0
        self._field = field
        self._tokens: dict[int, list[int]] = {}

    def _line(self, index: int) -> list[int]:
        if index not in self._tokens:
            text = self._corpus.lines[index]
            self._tokens[index] = self._tokenizer(text, add_special_tokens=False)["input_ids"]
        return self._tokens[index]

    def take(self, length: int) -> list[int]:
        """`length` consecutive tokens from the next unused line start."""
        count = len(self._corpus.lines)
        first = self._corpus.starts[int(self._order[self._taken % len(self._order)])]
        self._taken += 1
        ids: list[int] = []
        index = first
        while len(ids) < length:
            ids.extend(self._line(index))
            index = (index + 1) % count
            if index == first and len(ids) < length:
                raise ConfigError(
                    self._field, f"a prompt of {length} tokens is longer than the whole text"
                )
        return ids[:length]


def special_ids(tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """Every id the tokenizer marks special (named special tokens and special added tokens)."""
    found = set(tokenizer.all_special_ids)
    found.update(i for i, token in tokenizer.added_tokens_decoder.items() if token.special)
    return found


def ordinary_ids(tokenizer: PreTrainedTokenizerBase) -> np.ndarray:
    """All ids of the vocabulary that are not special, ascending (int64)."""
    special = special_ids(tokenizer)
    return np.asarray([i for i in range(len(tokenizer)) if i not in special], dtype=np.int64)
