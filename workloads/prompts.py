"""Prompt sources: what each generated request says, at the token length it was drawn.

- `random`: uniformly random ids from the vocabulary without its special tokens.
- `text`: real text (`workloads/text.py`, section `prompts`) from a line start, cut to the
  drawn length.
- `instruct`: a task on a passage, through the chat template (`workloads/instruct.py`).
- `shared_prefix`: `groups` system prompts of `prefix_len` tokens of real text; request i
  is prompt `i mod groups` followed by its own text suffix of the drawn length, so the
  prompt has `prefix_len` + drawn tokens.
- `jsonl`: the prompts of a file the user brings (`workloads/promptfile.py`).
- `trace`: lengths from a trace file (`workloads/traces.py`), content from `fill`
  (`text`, `random` or `instruct`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from transformers import PreTrainedTokenizerBase

from servelab.base.errors import ConfigError
from servelab.workloads.corpus import Prompt, TextCorpus, TextWindows, ordinary_ids
from servelab.workloads.fields import Node
from servelab.workloads.instruct import TASKS, instruct_prompts

SOURCES = ("random", "text", "instruct", "shared_prefix", "jsonl", "trace")
GENERATED = ("random", "text", "instruct", "shared_prefix")
FILLS = ("text", "random", "instruct")
PROMPT_KEYS = ("source", "fill", "groups", "prefix_len", "tasks")


@dataclass(frozen=True)
class PromptSpec:
    """Where prompt content comes from."""

    source: str
    fill: str = "text"  # content of `trace` prompts
    groups: int = 1  # shared_prefix: number of distinct prefixes
    prefix_len: int = 0  # shared_prefix: tokens per prefix
    tasks: tuple[str, ...] = TASKS  # instruct: the tasks drawn from

    @property
    def content(self) -> str:
        """The generator that fills prompts of given lengths."""
        return self.fill if self.source == "trace" else self.source


def parse_prompt_spec(value: object, path: str) -> PromptSpec:
    """Read and check the `workload.prompt` node."""
    node = Node.of(value, path, PROMPT_KEYS)
    source = node.choice("source", SOURCES)
    fill = node.choice("fill", FILLS, default="text")
    tasks = _tasks(node)
    if source != "shared_prefix":
        return PromptSpec(source=source, fill=fill, tasks=tasks)
    groups = node.integer("groups", minimum=1)
    prefix_len = node.integer("prefix_len", minimum=1)
    return PromptSpec(source=source, groups=groups, prefix_len=prefix_len, tasks=tasks)


def _tasks(node: Node) -> tuple[str, ...]:
    value = node.raw("tasks")
    if value is None:
        return TASKS
    if not isinstance(value, list) or not value or any(t not in TASKS for t in value):
        raise ConfigError(
            node.field("tasks"), f"got {value!r}; give a non-empty list from {', '.join(TASKS)}"
        )
    return tuple(value)


def make_prompts(
    spec: PromptSpec,
    tokenizer: PreTrainedTokenizerBase,
    lengths: np.ndarray,
    rng: np.random.Generator,
    field: str,
) -> list[Prompt]:
    """One prompt per drawn length (plus the shared prefix, for `shared_prefix`)."""
    kind = spec.content
    if kind == "random":
        vocabulary = ordinary_ids(tokenizer)
        return [Prompt(ids=tuple(rng.choice(vocabulary, size=n).tolist())) for n in lengths]
    windows = TextWindows(TextCorpus.of(), tokenizer, rng, field)
    if kind == "instruct":
        return instruct_prompts(tokenizer, windows, lengths, spec.tasks, rng, field)
    prefixes: list[list[int]] = [[]]
    if kind == "shared_prefix":
        prefixes = [windows.take(spec.prefix_len) for _ in range(spec.groups)]
    prompts = []
    for index, length in enumerate(lengths.tolist()):
        ids = prefixes[index % len(prefixes)] + windows.take(length)
        prompts.append(Prompt(ids=tuple(ids), text=tokenizer.decode(ids)))
    return prompts
