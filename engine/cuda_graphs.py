"""Decode steps replayed from CUDA graphs, one captured per batch-size bucket.

A decode step of the fused GPU layers is hundreds of kernel launches (`benchmarks/
bench_launches.py`), each some microseconds of Python and driver work, so at small batches
the GPU waits on the host for most of a step. As vLLM's CUDA graph runner does (and gpt-fast
with `mode="reduce-overhead"`), the step is captured once per batch-size bucket (1, 2, 4,
then every 8 up to the engine's largest batch) over static input buffers; each decode step
then writes its metadata into a host copy of those buffers, moves it in one host-to-device
copy, pads its batch up to the next bucket and replays the bucket's graph.

Padded rows are sequences of one token that write no KV (slot -1: the rotary kernel skips
negative slots) and read block 0; their logits are computed and dropped. The decode
attention is planned for the longest sequence the cache holds, not the step's, so that one
captured launch serves every step (a split past a sequence's end returns at once). Prefill
and mixed steps, and batches beyond the largest bucket, run eagerly.

Each graph is checked as it is captured: replayed on its capture batch, its logits must
equal an eager forward's of the same batch bit for bit, or graphs are off for the run (as
they are when a capture fails), with the reason (`GraphsRecord`, `meta.json`'s
`cuda_graphs`). Off CUDA the same padded, static path runs eagerly instead of replaying
(`graphs=False`): the portable twin that tests the padding and the staging on any machine.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from servelab.base.batch import (
    AttentionFn,
    ForwardBatch,
    Layout,
    byte_views,
    layout_bytes,
)
from servelab.engine.kv_cache import KVCache

if TYPE_CHECKING:  # the runner holds these graphs
    from servelab.engine.model_runner import StepModel

SMALL_BUCKETS = (1, 2, 4)  # then every BUCKET_STEP rows
BUCKET_STEP = 8
PAD_SLOT = -1  # a padded row's KV slot: nothing is written


def buckets_for(max_rows: int) -> tuple[int, ...]:
    """The batch sizes captured for an engine of at most `max_rows` sequences a step: 1, 2,
    4, then every 8, up to the first that holds `max_rows`."""
    small = [b for b in SMALL_BUCKETS if b < max_rows]
    if max_rows <= SMALL_BUCKETS[-1]:
        return (*small, next(b for b in SMALL_BUCKETS if b >= max_rows))
    top = math.ceil(max_rows / BUCKET_STEP) * BUCKET_STEP
    return (*small, *range(BUCKET_STEP, top + 1, BUCKET_STEP))


@dataclass(frozen=True)
class GraphsRecord:
    """Whether decode steps replay graphs, which, and what capturing them took."""

    enabled: bool
    reason: str  # why on or off
    buckets: tuple[int, ...] = ()
    capture_s: float = 0.0


class Staging:
    """A step's decode metadata for up to `rows` sequences, as views into one byte buffer, so
    that the host's copy moves to the device in one transfer. The block tables come last: a
    bucket of `b` rows moves the fixed arrays and `b` rows of the table (`bytes_for`)."""

    def __init__(self, rows: int, width: int, device: torch.device, pin: bool) -> None:
        layout: Layout = [  # widest elements first, so that every view lands aligned
            ((rows,), torch.int64),  # ids
            ((rows,), torch.int64),  # positions
            ((rows,), torch.int64),  # slots
            ((rows,), torch.int64),  # slab starts
            ((rows,), torch.int32),  # sequence lengths
            ((rows, width), torch.int32),  # block tables
        ]
        self.buffer = torch.zeros(layout_bytes(layout), dtype=torch.uint8, device=device)
        if pin:
            self.buffer = self.buffer.pin_memory()
        views = byte_views(self.buffer, layout)
        self.ids, self.positions, self.slots, self.slab_starts, self.seq_lens = views[:5]
        self.block_tables = views[5]
        self._table_offset = layout_bytes(layout[:5])
        self._row_bytes = width * torch.int32.itemsize

    def bytes_for(self, rows: int) -> int:
        return self._table_offset + rows * self._row_bytes

    def pad(self, start: int, end: int) -> None:
        """Rows `start:end` as padding: one token at position 0 of block 0, written nowhere."""
        self.ids[start:end] = 0
        self.positions[start:end] = 0
        self.slots[start:end] = PAD_SLOT
        self.slab_starts[start:end] = 0
        self.seq_lens[start:end] = 1
        self.block_tables[start:end] = 0

    def fill(self, batch: ForwardBatch, bucket: int) -> None:
        """A host batch's decode metadata in rows `:num_seqs`, padding up to `bucket`."""
        rows = batch.num_seqs
        self.ids[:rows] = batch.input_ids
        self.positions[:rows] = batch.positions
        self.slots[:rows] = batch.slot_mapping
        self.seq_lens[:rows] = batch.seq_lens
        if batch.block_tables is not None:
            self.block_tables[:rows, : batch.block_tables.shape[1]] = batch.block_tables
        else:
            assert batch.slab_starts is not None
            self.slab_starts[:rows] = batch.slab_starts
        self.pad(rows, bucket)


@dataclass(frozen=True)
class _Bucket:
    rows: int
    replay: Callable[[], torch.Tensor]  # the bucket's logits [rows, vocab], from static inputs


class DecodeGraphs:
    """Decode steps of up to `buckets[-1]` sequences, replayed per bucket (module docstring)."""

    def __init__(
        self,
        model: StepModel,
        cache: KVCache,
        attention: AttentionFn,
        paged: bool,
        capacity: int,
        device: torch.device,
    ) -> None:
        """Over `cache`, paged (block tables) or contiguous (slab starts); `capacity`: the
        longest sequence it holds."""
        self.model, self.cache, self.attention = model, cache, attention
        self.paged, self.capacity, self.device = paged, capacity, device
        self.block_size = cache.block_size if paged else 1
        self._buckets: list[_Bucket] = []  # ascending rows

    def capture(self, buckets: tuple[int, ...], graphs: bool = True) -> GraphsRecord:
        """Every bucket's graph, the largest first (they share one memory pool), each checked
        against an eager forward; `graphs=False` keeps the padded forwards, run eagerly (the
        portable twin). On a failed check no graph is kept and the record says why."""
        began = time.perf_counter()
        rows = max(buckets)
        width = math.ceil(self.capacity / self.block_size) if self.paged else 1
        self._host = Staging(rows, width, torch.device("cpu"), pin=graphs)
        self._static = Staging(rows, width, self.device, pin=False)
        self._rows = torch.arange(rows, device=self.device)
        self._host_rows = torch.arange(rows)
        self._query_starts = torch.arange(rows + 1, dtype=torch.int32, device=self.device)
        self._host.pad(0, rows)
        self._static.buffer.copy_(self._host.buffer)
        pool = torch.cuda.graph_pool_handle() if graphs else None
        try:
            made = [
                self._capture(size, pool) if graphs else self._eager(size)
                for size in sorted(buckets, reverse=True)
            ]
        except RuntimeError as failed:  # a mismatch, or an operation a capture refused
            first = str(failed).strip().splitlines()[0] if str(failed).strip() else repr(failed)
            return GraphsRecord(False, f"capture failed, decode runs eagerly: {first}")
        self._buckets = made[::-1]
        how = "captured per bucket" if graphs else "padded eager forwards (no capture)"
        return GraphsRecord(True, how, tuple(sorted(buckets)), time.perf_counter() - began)

    def run(self, batch: ForwardBatch) -> torch.Tensor | None:
        """The logits of a host batch's decode step, replayed from its bucket's graph (valid
        until the next replay); None where no graph serves it (not decode-only, more rows than
        the largest bucket, logits not one per sequence in order, a wider block table)."""
        rows = batch.num_seqs
        bucket = next((b for b in self._buckets if b.rows >= rows), None)
        if bucket is None or not batch.is_decode_only or batch.device_lens is not None:
            return None
        tables = batch.block_tables
        if (tables is not None) != self.paged or not torch.equal(
            batch.logits_indices, self._host_rows[:rows]
        ):
            return None
        if tables is not None and tables.shape[1] > self._host.block_tables.shape[1]:
            return None
        self._host.fill(batch, bucket.rows)
        size = self._host.bytes_for(bucket.rows)
        self._static.buffer[:size].copy_(self._host.buffer[:size], non_blocking=True)
        return bucket.replay()[:rows]

    def static_batch(self, rows: int) -> ForwardBatch:
        """The static batch of a bucket: device views of the staging; the host lengths say
        the longest sequence the cache holds, which the decode attention is planned for."""
        s = self._static
        return ForwardBatch(
            input_ids=s.ids[:rows],
            positions=s.positions[:rows],
            query_start_loc=torch.arange(rows + 1, dtype=torch.int32),
            seq_lens=torch.full((rows,), self.capacity, dtype=torch.int32),
            query_lens=[1] * rows,
            slot_mapping=s.slots[:rows],
            logits_indices=self._rows[:rows],
            slab_starts=None if self.paged else s.slab_starts[:rows],
            block_tables=s.block_tables[:rows] if self.paged else None,
            block_size=self.block_size,
            device_lens=(s.seq_lens[:rows], self._query_starts[: rows + 1]),
        )

    def _forward(self, batch: ForwardBatch) -> torch.Tensor:
        with torch.inference_mode():
            return self.model(batch, self.cache.k, self.cache.v, self.attention)

    def _eager(self, rows: int) -> _Bucket:
        batch = self.static_batch(rows)
        return _Bucket(rows, lambda: self._forward(batch))

    def _capture(self, rows: int, pool: tuple[int, int] | None) -> _Bucket:
        batch = self.static_batch(rows)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):  # compiles and allocates outside the capture
            expected = self._forward(batch)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            out = self._forward(batch)
        graph.replay()
        torch.cuda.synchronize(self.device)
        if not torch.equal(out, expected):
            worst = float((out - expected).abs().max())
            raise GraphMismatch(
                f"the graph of {rows} rows replayed logits off the eager forward's by up to "
                f"{worst:.3g}"
            )

        def replay() -> torch.Tensor:
            graph.replay()
            return out

        return _Bucket(rows, replay)  # the closure keeps the graph


class GraphMismatch(RuntimeError):
    """A captured graph's replay did not reproduce the eager forward."""
