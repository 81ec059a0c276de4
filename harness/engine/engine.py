"""The engine loop: one `step()` is one scheduling decision and one model forward.

Each step asks the scheduler for the batch (which requests, how many new tokens each),
builds one explicit `ForwardBatch` from the KV manager's slots and layout, runs the model,
samples for the sequences whose known tokens are all computed, appends, finishes and frees.
It returns the finished requests and one step record (`steps.jsonl`). Per-step Python work
scales with the number of requests, not tokens: positions and slots are built with tensor
operations.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from harness.engine.batch import ForwardBatch
from harness.engine.kv_cache import KVCache
from harness.engine.kv_manager import KVStats
from harness.engine.request import Request, RequestState
from harness.engine.sampler import sample
from harness.measure.roofline import StepRoofline
from harness.models.model import AttentionFn, LlamaModel
from strategies.batching.base import ScheduledSeq, Scheduler


@dataclass
class StepResult:
    finished: list[Request]
    record: dict


class Engine:
    def __init__(
        self,
        model: LlamaModel,
        kv_cache: KVCache,
        scheduler: Scheduler,
        attention: AttentionFn,
        device: torch.device,
        clock: Callable[[], float],
        max_context: int,
        roofline: StepRoofline | None = None,
    ) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.scheduler = scheduler
        self.attention = attention
        self.device = device
        self.clock = clock
        self.max_context = max_context
        self.eos_ids = frozenset(model.config.eos_token_ids)
        self.roofline = roofline
        self.step_index = 0

    def add_request(self, request: Request) -> None:
        self.scheduler.add(request)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> StepResult | None:
        """Run one step; None when the scheduler has nothing runnable."""
        t_start = self.clock()
        plan = self.scheduler.schedule()
        if not plan.seqs:
            return None
        for seq in plan.seqs:
            if seq.request.t_admitted is None:
                seq.request.t_admitted = t_start
        for request in plan.preempted:
            request.preempt_times.append(t_start)
        batch, sampling = self._build_batch(plan.seqs)
        t_model = time.perf_counter()
        logits = self._forward(batch)
        tokens = sample(logits, sampling) if sampling else []
        model_s = time.perf_counter() - t_model
        now = self.clock()
        for seq in plan.seqs:
            seq.request.num_computed_tokens += seq.num_new_tokens
        kv_stats = self.scheduler.kv.stats()  # as held during the step, before anything is freed
        finished = [
            r for r, token in zip(sampling, tokens, strict=True) if self._append(r, token, now)
        ]
        for request in finished:
            self.scheduler.on_finished(request)
        record = self._record(plan.seqs, plan.preempted, t_start, model_s, kv_stats, len(sampling))
        self.step_index += 1
        return StepResult(finished=finished, record=record)

    def _forward(self, batch: ForwardBatch) -> torch.Tensor:
        with torch.inference_mode():
            logits = self.model(
                batch.to(self.device), self.kv_cache.k, self.kv_cache.v, self.attention
            )
        return logits.cpu()

    def _build_batch(self, seqs: list[ScheduledSeq]) -> tuple[ForwardBatch, list[Request]]:
        requests = [s.request for s in seqs]
        starts = [r.num_computed_tokens for r in requests]
        counts = [s.num_new_tokens for s in seqs]
        ids: list[int] = []
        for request, start, count in zip(requests, starts, counts, strict=True):
            ids += request.token_slice(start, start + count)
        counts_t = torch.tensor(counts, dtype=torch.int64)
        ends_t = torch.tensor(starts, dtype=torch.int64) + counts_t
        query_start_loc = torch.zeros(len(seqs) + 1, dtype=torch.int64)
        torch.cumsum(counts_t, 0, out=query_start_loc[1:])
        row_seq = torch.repeat_interleave(torch.arange(len(seqs)), counts_t)
        positions = torch.arange(len(ids)) - query_start_loc[row_seq] + (ends_t - counts_t)[row_seq]
        kv = self.scheduler.kv
        slot_mapping = torch.cat(
            [kv.slot_mapping(r, s, s + c) for r, s, c in zip(requests, starts, counts, strict=True)]
        )
        # a sequence samples when this step computes the last of its known tokens
        samples = [end == r.num_tokens for r, end in zip(requests, ends_t.tolist(), strict=True)]
        sampling = [r for r, flag in zip(requests, samples, strict=True) if flag]
        ends = query_start_loc[1:] - 1
        logits_rows = ends[torch.tensor(samples, dtype=torch.bool)]
        layout = kv.layout(requests)
        batch = ForwardBatch(
            input_ids=torch.tensor(ids, dtype=torch.int64),
            positions=positions,
            query_start_loc=query_start_loc.to(torch.int32),
            seq_lens=ends_t.to(torch.int32),
            query_lens=counts,
            slot_mapping=slot_mapping,
            logits_indices=logits_rows,
            slab_starts=layout.get("slab_starts"),
            block_tables=layout.get("block_tables"),
            block_size=int(layout.get("block_size", 1)),
        )
        return batch, sampling

    def _append(self, request: Request, token: int, now: float) -> bool:
        """Append a sampled token; finish the request if it stops. True when it finished."""
        request.output_ids.append(token)
        request.token_times.append(now)
        if token in self.eos_ids and not request.sampling.ignore_eos:
            reason = "stop"
        elif (
            len(request.output_ids) >= request.sampling.max_tokens
            or request.num_tokens >= self.max_context
        ):
            reason = "length"
        else:
            return False
        request.state = RequestState.FINISHED
        request.finish_reason = reason
        return True

    def _record(
        self,
        seqs: list[ScheduledSeq],
        preempted: list[Request],
        t_start: float,
        model_s: float,
        kv: KVStats,
        num_logits: int,
    ) -> dict:
        decode = sum(
            1
            for s in seqs
            if s.num_new_tokens == 1 and s.request.num_computed_tokens > s.request.prompt_len
        )
        total = sum(s.num_new_tokens for s in seqs)
        record = {
            "step": self.step_index,
            "t_start": t_start,
            "t_end": self.clock(),
            "model_s": model_s,
            "num_seqs": len(seqs),
            "prefill_tokens": total - decode,
            "decode_tokens": decode,
            "waiting": len(self.scheduler.waiting),
            "running": len(self.scheduler.running),
            "kv_allocated_slots": kv.allocated_slots,
            "kv_live_slots": kv.live_slots,
            "kv_total_slots": kv.total_slots,
            "kv_waste": kv.waste,
            "preempted": len(preempted),
        }
        record.update(kv.extra)
        if self.roofline is not None:
            self.roofline.annotate(
                record,
                [s.num_new_tokens for s in seqs],
                [s.request.num_computed_tokens for s in seqs],
                num_logits,
            )
        return record
