"""Instruction prompts whose answer depends on the passage they carry.

Each request gets one task (summarise the passage, continue it, or answer a question from
it), a passage of real text, and the chat template around both; the passage is cut so that
the whole prompt has exactly the drawn number of tokens. The answer therefore depends on
the input, which is what speculative decoding and quantisation must be measured on.
"""

from __future__ import annotations

import numpy as np
from transformers import PreTrainedTokenizerBase

from servelab.base.errors import ConfigError
from servelab.workloads.chat import ChatFrame
from servelab.workloads.corpus import Prompt, TextWindows

INSTRUCTIONS = {
    "summarise": "Summarise the following passage in three sentences.",
    "continue": "Continue the following passage with one more paragraph in the same style.",
    "answer": (
        "Using only the passage below, answer: which Python statements, functions or types "
        "does it describe, and what does it say about each of them?"
    ),
}
TASKS = tuple(INSTRUCTIONS)


def instruct_prompts(
    tokenizer: PreTrainedTokenizerBase,
    windows: TextWindows,
    lengths: np.ndarray,
    tasks: tuple[str, ...],
    rng: np.random.Generator,
    field: str,
) -> list[Prompt]:
    """One instruction prompt of exactly `lengths[i]` tokens per request."""
    frames = [ChatFrame.around_passage(tokenizer, INSTRUCTIONS[task], field) for task in tasks]
    shortest = max(frame.overhead for frame in frames) + 1
    if len(lengths) and int(lengths.min()) < shortest:
        raise ConfigError(
            field,
            f"a drawn prompt has {int(lengths.min())} tokens, but instruct prompts need at "
            f"least {shortest} (chat template + instruction + passage); raise the lengths",
        )
    prompts = []
    for length in lengths.tolist():
        frame = frames[int(rng.integers(0, len(frames)))]
        passage = windows.take(length - frame.overhead)
        prompts.append(
            Prompt(
                ids=frame.head_ids + tuple(passage) + frame.tail_ids,
                text=frame.head_text + tokenizer.decode(passage) + frame.tail_text,
            )
        )
    return prompts
