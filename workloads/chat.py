"""Prompts through the tokenizer's chat template, as an instruction-tuned model expects them.

`chat_ids` renders one user message with the generation prompt appended. `ChatFrame`
splits the rendered template around a passage, so that a passage of exactly N tokens can
be placed inside it and the whole prompt has a known length.
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from servelab.base.errors import ConfigError

_MARK = "\x00PASSAGE\x00"


def _require_template(tokenizer: PreTrainedTokenizerBase, field: str) -> None:
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(field, "the tokenizer has no chat template; send raw text instead")


def chat_ids(tokenizer: PreTrainedTokenizerBase, content: str, field: str) -> list[int]:
    """Token ids of one user message followed by the assistant's turn."""
    _require_template(tokenizer, field)
    messages = [{"role": "user", "content": content}]
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    return [int(i) for i in ids]


@dataclass(frozen=True)
class ChatFrame:
    """The template's text and token ids before and after a passage."""

    head_text: str
    tail_text: str
    head_ids: tuple[int, ...]
    tail_ids: tuple[int, ...]

    @staticmethod
    def around_passage(
        tokenizer: PreTrainedTokenizerBase, instruction: str, field: str
    ) -> ChatFrame:
        """The frame of a user message `instruction`, a blank line, then the passage."""
        _require_template(tokenizer, field)
        messages = [{"role": "user", "content": f"{instruction}\n\n{_MARK}"}]
        rendered = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        )
        head, tail = str(rendered).split(_MARK)
        return ChatFrame(
            head_text=head,
            tail_text=tail,
            head_ids=tuple(tokenizer(head, add_special_tokens=False)["input_ids"]),
            tail_ids=tuple(tokenizer(tail, add_special_tokens=False)["input_ids"]),
        )

    @property
    def overhead(self) -> int:
        """Tokens the frame adds around the passage."""
        return len(self.head_ids) + len(self.tail_ids)
