"""The model runner: the one place a forward runs, for the target model and a draft network.

It packs what a step feeds (`Feed`: per sequence, where its new tokens start and how many,
the token ids, the rows whose logits are wanted; its `StepShape`, the counts a step's cost
and record take, made once per feed; both plain dataclasses, made every step, where a frozen
one's `__init__` took twice as long) over a KV manager's slots into one
`ForwardBatch`, moves it to the device, runs the model over its KV cache with the run's
attention, and returns the wanted logits where they were computed: sampling takes greedy
tokens by an argmax there and copies only their ids (and any row sampled at random) to the
host, not a [rows, vocab] tensor a step. Decode steps may replay captured CUDA graphs
instead (`graphs`, set where the engine is built). The engine runs the target through one; a
speculative drafter runs its network through another. It is the seam where a forward can be
replaced: anything with `run(kv, feed) -> logits` serves (`Runner`; `harness.run.simulate.runner`
predicts a step's time instead).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Protocol

import torch

from servelab.base.batch import AttentionFn, ForwardBatch
from servelab.engine.cuda_graphs import DecodeGraphs, GraphsRecord
from servelab.engine.kv_cache import KVCache
from servelab.engine.kv_manager import KVManager
from servelab.engine.packing import pack
from servelab.engine.request import Request


class StepModel(Protocol):
    """What a runner needs of a model: next-token logits for the rows a batch asks for."""

    def __call__(
        self,
        batch: ForwardBatch,
        k_caches: list[torch.Tensor],
        v_caches: list[torch.Tensor],
        attention: AttentionFn,
    ) -> torch.Tensor: ...


@dataclass
class Feed:
    """What one forward feeds: sequence `i` feeds `counts[i]` tokens from position
    `starts[i]` on (its KV slots already grown); `ids` holds every fed token in that order;
    logits come back for `logits_rows` (indices into `ids`)."""

    requests: list[Request]
    starts: list[int]
    counts: list[int]
    ids: list[int]
    logits_rows: list[int]
    shape: StepShape = field(init=False, repr=False, compare=False)  # for cost accounting

    def __post_init__(self) -> None:
        """The batch this feeds, counted once (asked by the runner and the record)."""
        seq_lens = [start + count for start, count in zip(self.starts, self.counts, strict=True)]
        self.shape = StepShape(list(self.counts), seq_lens, len(self.logits_rows))


@dataclass
class StepShape:
    """The batch a step ran, for cost accounting: per sequence, tokens fed and context; the
    totals a step's cost and record take are counted once, when it is made."""

    EMPTY: ClassVar[StepShape]  # no forward ran
    query_lens: list[int]
    seq_lens: list[int]
    num_logits: int
    attended_pairs: int = field(init=False)  # (query, key) pairs causal attention scores
    context_tokens: int = field(init=False)  # context the sequences hold after the step

    def __post_init__(self) -> None:
        self.attended_pairs = sum(map(attended_pairs, self.query_lens, self.seq_lens))
        self.context_tokens = sum(self.seq_lens)


def attended_pairs(query_len: int, seq_len: int) -> int:
    """How many (query, key) pairs causal attention scores for one sequence in one step.

    The `query_len` new tokens end a context of `seq_len` tokens: new token i (0-based) sits at
    position seq_len - query_len + i and attends to itself and every earlier position.
    """
    cached = seq_len - query_len
    return query_len * cached + query_len * (query_len + 1) // 2


StepShape.EMPTY = StepShape([], [], 0)


class Runner(Protocol):
    """What the engine needs of a runner: the wanted logits of one forward."""

    def run(self, kv: KVManager, feed: Feed) -> torch.Tensor: ...


class ModelRunner:
    """Runs `model` over `cache` with `attention` on `device`."""

    def __init__(
        self, model: StepModel, cache: KVCache, attention: AttentionFn, device: torch.device
    ) -> None:
        self.model = model
        self.cache = cache
        self.attention = attention
        self.device = device
        self.graphs: DecodeGraphs | None = None  # decode steps replayed, where captured
        self.graphs_record = GraphsRecord(False, "none captured for this runner")
        self._events = (  # around every forward on CUDA, made once and recorded again
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            if device.type == "cuda"
            else None
        )

    def run(self, kv: KVManager, feed: Feed) -> torch.Tensor:
        """Logits [len(feed.logits_rows), vocab] on the model's device; on CUDA the forward
        is bracketed by a pair of events (`gpu_seconds`)."""
        batch = pack(kv, feed.requests, feed.starts, feed.counts, feed.ids, feed.logits_rows)
        if self._events is not None:
            self._events[0].record()
        logits = self.graphs.run(batch) if self.graphs is not None else None
        if logits is None:
            with torch.inference_mode():
                device_batch = batch.to(self.device)
                logits = self.model(device_batch, self.cache.k, self.cache.v, self.attention)
        if self._events is not None:
            self._events[1].record()
        return logits

    def gpu_seconds(self) -> float | None:
        """The last forward's time on the GPU, between its events (waiting for the second);
        None off CUDA. Asked only after a forward."""
        if self._events is None:
            return None
        start, end = self._events
        end.synchronize()
        return start.elapsed_time(end) / 1e3
