"""A prompt file the user brings: JSON Lines, one request per line.

Each line is an object with either `prompt` (text; sent through the chat template unless
`raw: true`, then tokenized as it is) or `prompt_ids` (a list of token ids), and optionally
`max_tokens` (else drawn from `workload.output_len`), `arrival` (seconds from the start;
replayed when `workload.arrival.process` is `trace`) and `id` (else the line's index).
Blank lines are skipped; anything else that is wrong stops the build with the line number.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from servelab.base.errors import ConfigError
from servelab.workloads.chat import chat_ids
from servelab.workloads.corpus import Prompt
from servelab.workloads.fields import Where

LINE_KEYS = ("prompt", "prompt_ids", "raw", "max_tokens", "arrival", "id")


@dataclass(frozen=True)
class FileRequest:
    """One line of the prompt file, checked and tokenized."""

    id: str | None
    prompt: Prompt
    max_tokens: int | None
    arrival: float | None


def read_prompt_file(
    path: Path, tokenizer: PreTrainedTokenizerBase, field: str
) -> list[FileRequest]:
    """Every request of the file, in file order."""
    if not path.is_file():
        raise ConfigError(field, f"{path} does not exist; give an existing .jsonl prompt file")
    entries = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if line.strip():
                entries.append(_entry(line, tokenizer, Where(field, f"{path} line {number}")))
    if not entries:
        raise ConfigError(field, f"{path} has no requests; write one JSON object per line")
    return entries


def _entry(line: str, tokenizer: PreTrainedTokenizerBase, where: Where) -> FileRequest:
    try:
        item = json.loads(line)
    except json.JSONDecodeError as error:
        raise where.error(f"not valid JSON ({error.msg})") from error
    if not isinstance(item, dict):
        raise where.error("each line must be a JSON object")
    unknown = sorted(set(item) - set(LINE_KEYS))
    if unknown:
        raise where.error(f"unknown key {unknown[0]!r}; known: {', '.join(LINE_KEYS)}")
    return FileRequest(
        id=_identifier(item.get("id"), where),
        prompt=_prompt(item, tokenizer, where),
        max_tokens=_max_tokens(item.get("max_tokens"), where),
        arrival=_arrival(item.get("arrival"), where),
    )


def _prompt(item: dict, tokenizer: PreTrainedTokenizerBase, where: Where) -> Prompt:
    if ("prompt" in item) == ("prompt_ids" in item):
        raise where.error("give exactly one of 'prompt' (text) or 'prompt_ids'")
    raw = item.get("raw", False)
    if not isinstance(raw, bool):
        raise where.error(f"'raw' must be true or false, got {raw!r}")
    if "prompt_ids" in item:
        return Prompt(ids=_token_ids(item["prompt_ids"], len(tokenizer), where))
    text = item["prompt"]
    if not isinstance(text, str) or not text:
        raise where.error("'prompt' must be non-empty text")
    if raw:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    else:
        ids = chat_ids(tokenizer, text, where.field)
    return Prompt(ids=tuple(ids), text=text)


def _token_ids(value: object, vocabulary: int, where: Where) -> tuple[int, ...]:
    if not isinstance(value, list) or not value:
        raise where.error("'prompt_ids' must be a non-empty list of token ids")
    for token in value:
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocabulary:
            raise where.error(
                f"'prompt_ids' holds {token!r}; ids must be integers in [0, {vocabulary})"
            )
    return tuple(value)


def _max_tokens(value: object, where: Where) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise where.error(f"'max_tokens' is {value!r}; it must be an integer >= 1")
    return value


def _arrival(value: object, where: Where) -> float | None:
    if value is None:
        return None
    number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else -1.0
    if not (math.isfinite(number) and number >= 0):
        raise where.error(f"'arrival' is {value!r}; it must be seconds >= 0")
    return float(number)


def _identifier(value: object, where: Where) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)) or value == "":
        raise where.error(f"'id' is {value!r}; it must be a non-empty string or integer")
    return str(value)
