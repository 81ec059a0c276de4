"""The engine loop: one `step()` is one scheduling decision and one model forward.

Each step lets the decoding strategy propose drafts, asks the scheduler for the batch (which
requests, how many tokens each feeds, any padding rows), builds one explicit `ForwardBatch`
from the KV manager's slots and layout, runs the model, lets the decoding strategy accept
tokens from the logits of every sequence whose next token is due, appends them, rolls the
KV cache back past rejected drafts, finishes and frees. It returns the responses delivered
at the end of the step and one typed step record. Per-step Python work scales with the
number of requests, not tokens: positions and slots are built with tensor operations.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from harness.engine.batch import AttentionFn, ForwardBatch
from harness.engine.decoding import Decoder, Verification
from harness.engine.kv_cache import KVCache
from harness.engine.packing import pack
from harness.engine.request import Request
from harness.engine.scheduling import ScheduledSeq, Scheduler
from harness.records import StepRecord


class StepModel(Protocol):
    """What the engine needs of a model: next-token logits for the rows a batch asks for."""

    def __call__(
        self,
        batch: ForwardBatch,
        k_caches: list[torch.Tensor],
        v_caches: list[torch.Tensor],
        attention: AttentionFn,
    ) -> torch.Tensor: ...


@dataclass(frozen=True)
class StepShape:
    """The batch a step ran, for cost accounting: per sequence, tokens fed and context."""

    query_lens: list[int]
    seq_lens: list[int]
    num_logits: int


@dataclass
class StepResult:
    delivered: list[Request]  # responses handed back at the end of this step (t_done set)
    record: StepRecord
    shape: StepShape


@dataclass
class _Batch:
    forward: ForwardBatch
    due: list[Verification]
    shape: StepShape


class Engine:
    def __init__(
        self,
        model: StepModel,
        kv_cache: KVCache,
        scheduler: Scheduler,
        decoder: Decoder,
        attention: AttentionFn,
        device: torch.device,
        clock: Callable[[], float],
        max_context: int,
        stop_token_ids: Sequence[int],
    ) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.scheduler = scheduler
        self.decoder = decoder
        self.attention = attention
        self.device = device
        self.clock = clock
        self.max_context = max_context
        self.stop_token_ids = frozenset(stop_token_ids)
        self.pad_token_id = min(stop_token_ids, default=0)  # what padding rows are fed
        self.step_index = 0

    def add_request(self, request: Request) -> bool:
        """Queue a request; False, with the request finished as `rejected` and the reason
        in its `error`, when it can never be served."""
        reason = self.rejection(request)
        if reason is not None:
            request.finish("rejected", reason)
            request.t_done = self.clock()
            return False
        self.scheduler.add(request)
        return True

    def rejection(self, request: Request) -> str | None:
        """Why `request` can never be served here (None: it can)."""
        limit = self.scheduler.limit_error(request)
        if limit is not None:
            return str(limit)
        if request.prompt_len >= self.max_context:
            return (
                f"prompt of {request.prompt_len} tokens leaves no room in a context of "
                f"{self.max_context}"
            )
        if not self.scheduler.kv.fits_empty(request):
            return (
                f"needs {request.max_total_tokens} tokens of KV, more than the whole cache "
                f"holds ({self.scheduler.kv.total_slots})"
            )
        return None

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def cancel(self, request: Request) -> bool:
        """Drop a request whose client went away, between steps: the scheduler forgets it, its
        KV returns to the cache, and it finishes as `cancelled` (even if it had finished and
        its response was only held). False, and nothing changes, once it was delivered."""
        if request.t_done is not None:
            return False
        self.scheduler.cancel(request)
        self.decoder.release(request)
        request.finish("cancelled")
        request.t_done = self.clock()
        return True

    def step(self) -> StepResult | None:
        """Run one step; None when the scheduler has nothing to run or deliver."""
        t_start = self.clock()
        self.decoder.propose(self.scheduler.running_requests())
        plan = self.scheduler.schedule()
        for request in plan.preempted:
            request.preempt_times.append(t_start)
            self.decoder.release(request)
        delivered = self._deliver(plan.delivered, t_start)
        if not plan.seqs:
            return None if not delivered else self._empty_result(delivered, t_start)
        for seq in plan.seqs:
            if seq.request.t_admitted is None:
                seq.request.t_admitted = t_start
        batch = self._build_batch(plan.seqs)
        t_model = time.perf_counter()
        logits = self._forward(batch.forward)
        accepted = self.decoder.accept(logits, batch.due) if batch.due else []
        model_s = time.perf_counter() - t_model
        now = self.clock()
        record = self._record(plan.seqs, len(plan.preempted), t_start, model_s)
        for seq in plan.seqs:
            seq.request.num_computed_tokens += seq.num_new_tokens
        self._fill_kv(record)  # as held during the step, before anything finishes or is freed
        finished = self._accept(batch.due, accepted, now)
        record.counters.update(self.decoder.step_counters())
        for request in finished:
            self.decoder.release(request)
            delivered += self._deliver(self.scheduler.on_finished(request), now)
        return self._close(record, delivered, batch.shape)

    def _fill_kv(self, record: StepRecord) -> None:
        stats = self.scheduler.kv.stats()
        record.kv_allocated_slots = stats.allocated_slots
        record.kv_live_slots = stats.live_slots
        record.kv_total_slots = stats.total_slots
        record.kv_waste = stats.waste
        record.counters.update(stats.extra)

    def _close(self, record: StepRecord, delivered: list[Request], shape: StepShape) -> StepResult:
        record.delivered = len(delivered)
        record.waiting = self.scheduler.num_waiting()
        record.t_end = self.clock()
        self.step_index += 1
        return StepResult(delivered, record, shape)

    def _deliver(self, requests: list[Request], now: float) -> list[Request]:
        for request in requests:
            request.t_done = now
        return list(requests)

    def _forward(self, batch: ForwardBatch) -> torch.Tensor:
        with torch.inference_mode():
            logits = self.model(
                batch.to(self.device), self.kv_cache.k, self.kv_cache.v, self.attention
            )
        return logits.cpu()

    def _build_batch(self, seqs: list[ScheduledSeq]) -> _Batch:
        requests = [s.request for s in seqs]
        starts = [r.num_computed_tokens for r in requests]
        fed = [s.num_new_tokens + s.num_pad_tokens for s in seqs]
        ids: list[int] = []
        due: list[Verification] = []
        rows: list[int] = []
        row = 0
        for seq, start, count in zip(seqs, starts, fed, strict=True):
            request, real = seq.request, seq.num_new_tokens
            ids += request.token_slice(start, start + real)
            ids += [self.pad_token_id] * seq.num_pad_tokens
            end, known = start + real, request.num_tokens
            if real and end >= known:  # the next token is due: score the last known token
                first = row + known - 1 - start  # and every draft fed after it
                rows += range(first, row + real)
                due.append(Verification(request, end - known))
            row += count
        forward = pack(self.scheduler.kv, requests, starts, fed, ids, rows)
        seq_lens = [start + count for start, count in zip(starts, fed, strict=True)]
        return _Batch(forward, due, StepShape(fed, seq_lens, len(rows)))

    def _accept(
        self, due: list[Verification], accepted: list[list[int]], now: float
    ) -> list[Request]:
        """Append each due sequence's accepted tokens and roll its KV back past rejected
        drafts; the requests that finished."""
        finished = []
        for verification, tokens in zip(due, accepted, strict=True):
            request = verification.request
            known = request.num_tokens
            request.draft_ids = []
            appended = self._append(request, tokens, now)
            valid = known + appended - 1  # the last appended token is not computed yet
            if valid < request.num_computed_tokens:
                self.scheduler.kv.truncate(request, valid)
            if request.is_finished:
                finished.append(request)
        return finished

    def _append(self, request: Request, tokens: list[int], now: float) -> int:
        """Append tokens until one stops the request; how many were appended."""
        for count, token in enumerate(tokens, start=1):
            request.output_ids.append(token)
            request.token_times.append(now)
            if token in self.stop_token_ids and not request.sampling.ignore_eos:
                request.finish("stop")
            elif (
                len(request.output_ids) >= request.sampling.max_tokens
                or request.num_tokens >= self.max_context
            ):
                request.finish("length")
            if request.is_finished:
                return count
        return len(tokens)

    def _record(
        self, seqs: list[ScheduledSeq], preempted: int, t_start: float, model_s: float
    ) -> StepRecord:
        """The step's record from its batch, before any request moves on (KV filled in later)."""
        prefill = decode = pad = 0
        for seq in seqs:
            request = seq.request
            pad += seq.num_pad_tokens
            in_decode = request.num_computed_tokens == request.num_tokens - 1
            if in_decode and request.num_tokens > request.prompt_len:
                decode += seq.num_new_tokens
            else:
                prefill += seq.num_new_tokens
        return StepRecord(
            step=self.step_index,
            t_start=t_start,
            t_end=t_start,
            model_s=model_s,
            num_seqs=len(seqs),
            prefill_tokens=prefill,
            decode_tokens=decode,
            waiting=0,
            running=self.scheduler.num_running(),
            kv_allocated_slots=0,
            kv_live_slots=0,
            kv_total_slots=0,
            kv_waste=0.0,
            preempted=preempted,
            pad_tokens=pad,
        )

    def _empty_result(self, delivered: list[Request], t_start: float) -> StepResult:
        """A scheduling decision that only released held responses: no forward ran."""
        record = self._record([], 0, t_start, 0.0)
        self._fill_kv(record)
        return self._close(record, delivered, StepShape([], [], 0))
