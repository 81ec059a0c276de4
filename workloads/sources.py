"""The three ways a workload's rows come to be: generated, read from a trace, or a prompt file.

Each returns a `Draft`: per request its id, prompt, output limit and scheduled time, in
generation (or file) order, before sorting, exclusion windows and hashing. Each concern
draws from its own seeded stream (`workloads/seeds.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from transformers import PreTrainedTokenizerBase

from servelab.base.errors import ConfigError
from servelab.workloads.arrivals import sample_arrivals
from servelab.workloads.config import ROOT, WorkloadConfig
from servelab.workloads.corpus import Prompt
from servelab.workloads.lengths import sample_lengths
from servelab.workloads.promptfile import FileRequest, read_prompt_file
from servelab.workloads.prompts import make_prompts
from servelab.workloads.seeds import Stream, stream
from servelab.workloads.traces import read_trace, replay_count

INPUT_FIELD = f"{ROOT}.input_len"
OUTPUT_FIELD = f"{ROOT}.output_len"
TRACE_FIELD = f"{ROOT}.trace.path"
FILE_FIELD = f"{ROOT}.path"


@dataclass(frozen=True)
class Draft:
    """Requests in generation order."""

    ids: list[str]
    prompts: list[Prompt]
    max_tokens: list[int]
    arrivals: np.ndarray  # float64 seconds


def draft_requests(
    config: WorkloadConfig, tokenizer: PreTrainedTokenizerBase, max_context: int
) -> Draft:
    """The rows of the workload, from whichever source the config names.

    Every request is checked to fit `max_context` (prompt + max_tokens) as soon as its
    lengths are known, before any prompt content is made.
    """
    if config.prompt.source == "trace":
        return _from_trace(config, tokenizer, max_context)
    if config.prompt.source == "jsonl":
        return _from_file(config, tokenizer, max_context)
    return _generated(config, tokenizer, max_context)


def _check_context(
    ids: list[str],
    prompt_lens: np.ndarray,
    max_tokens: np.ndarray,
    max_context: int,
    field: str,
    fix: str,
) -> None:
    """Stop at the first request whose prompt and output do not fit the context."""
    totals = prompt_lens + max_tokens
    over = np.flatnonzero(totals > max_context)
    if len(over):
        i = int(over[0])
        raise ConfigError(
            field,
            f"request {ids[i]} needs {int(prompt_lens[i])} prompt + {int(max_tokens[i])} output = "
            f"{int(totals[i])} tokens, over the model context of {max_context}; {fix}",
        )


def _generated(
    config: WorkloadConfig, tokenizer: PreTrainedTokenizerBase, max_context: int
) -> Draft:
    assert config.num_requests is not None and config.input_len is not None
    assert config.output_len is not None
    count = config.num_requests
    scale = config.length_scale
    inputs = sample_lengths(config.input_len, count, stream(config.seed, Stream.INPUT_LEN), scale)
    outputs = sample_lengths(
        config.output_len, count, stream(config.seed, Stream.OUTPUT_LEN), scale
    )
    prefix = config.prompt.prefix_len if config.prompt.source == "shared_prefix" else 0
    fix = "lower workload.input_len, workload.output_len or workload.length_scale"
    ids = [str(i) for i in range(count)]
    _check_context(ids, inputs + prefix, outputs, max_context, INPUT_FIELD, fix)
    return Draft(
        ids=ids,
        prompts=_fill(config, tokenizer, inputs, INPUT_FIELD),
        max_tokens=outputs.tolist(),
        arrivals=sample_arrivals(config.arrival, count, stream(config.seed, Stream.ARRIVAL)),
    )


def _from_trace(
    config: WorkloadConfig, tokenizer: PreTrainedTokenizerBase, max_context: int
) -> Draft:
    assert config.trace.path is not None
    rows = read_trace(Path(config.trace.path).expanduser(), TRACE_FIELD, config.trace.drop_empty)
    count = replay_count(rows.times, config.trace)
    inputs = _scaled(rows.input_tokens[:count], config.length_scale)
    outputs = _scaled(rows.output_tokens[:count], config.length_scale)
    fix = "lower workload.length_scale or truncate the trace"
    ids = [str(i) for i in range(count)]
    _check_context(ids, inputs, outputs, max_context, TRACE_FIELD, fix)
    return Draft(
        ids=ids,
        prompts=_fill(config, tokenizer, inputs, TRACE_FIELD),
        max_tokens=outputs.tolist(),
        arrivals=_arrivals(config, np.asarray(rows.times[:count])),
    )


def _from_file(
    config: WorkloadConfig, tokenizer: PreTrainedTokenizerBase, max_context: int
) -> Draft:
    assert config.path is not None
    entries = read_prompt_file(config.path, tokenizer, FILE_FIELD)
    times = _file_times(entries, config.arrival.process == "trace")
    count = replay_count(times.tolist(), config.trace)
    entries = entries[:count]
    ids = [entry.id or str(index) for index, entry in enumerate(entries)]
    if len(set(ids)) != len(ids):
        duplicate = next(i for i in ids if ids.count(i) > 1)
        raise ConfigError(FILE_FIELD, f"id {duplicate!r} appears twice; give each line its own id")
    max_tokens = _file_max_tokens(config, entries)
    prompt_lens = np.asarray([len(entry.prompt.ids) for entry in entries])
    fix = "shorten that line's prompt or its max_tokens"
    _check_context(ids, prompt_lens, np.asarray(max_tokens), max_context, FILE_FIELD, fix)
    return Draft(
        ids=ids,
        prompts=[entry.prompt for entry in entries],
        max_tokens=max_tokens,
        arrivals=_arrivals(config, times[:count]),
    )


def _file_times(entries: list[FileRequest], replay: bool) -> np.ndarray:
    """The file's own arrival times when they are replayed, else zeros (no truncation)."""
    given = [entry.arrival for entry in entries]
    if not replay or all(time is None for time in given):
        return np.zeros(len(entries))
    if any(time is None for time in given):
        raise ConfigError(
            FILE_FIELD, "some lines have 'arrival' and some do not; give it on every line or none"
        )
    times = np.asarray(given, dtype=np.float64)
    if np.any(np.diff(times) < 0):
        line = int(np.argmax(np.diff(times) < 0)) + 2
        raise ConfigError(FILE_FIELD, f"request {line} arrives before the one above it; sort it")
    return times


def _file_max_tokens(config: WorkloadConfig, entries: list[FileRequest]) -> list[int]:
    missing = [entry.max_tokens is None for entry in entries]
    drawn = np.zeros(len(entries), dtype=np.int64)
    if any(missing):
        if config.output_len is None:
            raise ConfigError(
                OUTPUT_FIELD, "lines without 'max_tokens' need a distribution to draw from"
            )
        rng = stream(config.seed, Stream.OUTPUT_LEN)
        drawn = sample_lengths(config.output_len, len(entries), rng, config.length_scale)
    return [
        int(drawn[i]) if entry.max_tokens is None else entry.max_tokens
        for i, entry in enumerate(entries)
    ]


def _arrivals(config: WorkloadConfig, times: np.ndarray) -> np.ndarray:
    """File times (scaled k times faster) for trace replay, else the configured process."""
    if config.arrival.process == "trace":
        return times / config.trace.time_scale
    return sample_arrivals(config.arrival, len(times), stream(config.seed, Stream.ARRIVAL))


def _fill(
    config: WorkloadConfig, tokenizer: PreTrainedTokenizerBase, lengths: np.ndarray, field: str
) -> list[Prompt]:
    rng = stream(config.seed, Stream.PROMPT)
    return make_prompts(config.prompt, tokenizer, lengths, rng, field)


def _scaled(counts: tuple[int, ...], scale: float) -> np.ndarray:
    values = np.asarray(counts, dtype=np.float64)
    return np.maximum(np.rint(values * scale), 1).astype(np.int64)
