"""The one update after a forward: append, accept, roll back, finish, free, deliver, record.

Given what a step scheduled, what it fed and the tokens the decoding strategy accepted from
its logits, `StepUpdate.apply` moves every request on in one place: each sequence's computed
count advances by what it fed; each sequence whose next token was due appends its accepted
tokens (stopping at a stop token, `max_tokens` or the context), its KV is rolled back past
rejected drafts, the other samples of a request for n > 1 start beside it with their first
tokens (`parallel_sampling`), and a finished request's decoder state and KV are released and
its response delivered when the scheduler says so (for n samples: when the last is). The
step's record is built once, here, from the batch as scheduled and the KV as held during the
step (before anything was freed).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from servelab.base.records import StepRecord
from servelab.engine.decoding import Decoder, Verification
from servelab.engine.kv_manager import KVManager
from servelab.engine.model_runner import Feed, StepShape
from servelab.engine.parallel_sampling import Fork, SampleGroups
from servelab.engine.request import Request
from servelab.engine.scheduling import ScheduledSeq, Scheduler, SchedulerOutput


@dataclass
class StepResult:
    delivered: list[Request]  # responses handed back at the end of this step (t_done set)
    record: StepRecord
    shape: StepShape


@dataclass
class StepOutput:
    """What one step did before the update: its plan, what it fed, what was accepted."""

    step: int
    plan: SchedulerOutput
    feed: Feed | None  # None: the step only released held responses, no forward ran
    due: list[Verification]
    accepted: list[list[int]]
    t_start: float
    model_s: float
    forks: dict[Request, list[Fork]] = field(default_factory=dict)  # sample 0 -> the others


class StepUpdate:
    def __init__(
        self,
        kv: KVManager,
        scheduler: Scheduler,
        decoder: Decoder,
        clock: Callable[[], float],
        max_context: int,
        stop_token_ids: Sequence[int],
    ) -> None:
        self.kv = kv
        self.scheduler = scheduler
        self.decoder = decoder
        self.clock = clock
        self.max_context = max_context
        self.stop_token_ids = frozenset(stop_token_ids)
        self.groups = SampleGroups()

    def apply(self, output: StepOutput) -> StepResult:
        now = self.clock()
        plan = output.plan
        running = self.scheduler.num_running()  # the batch as scheduled, before any finishes
        delivered = self._deliver(plan.delivered, output.t_start) if plan.delivered else []
        prefill, decode, pad = _advance(plan.seqs)
        kv = self.kv.stats()  # as held during the step, before anything finishes or is freed
        finished = self._accept(output.due, output.accepted, now)
        if output.forks:
            finished += self._fork(output.forks, now)
        counters: dict[str, float | list[int]] = dict(kv.extra)
        if output.feed is not None:
            counters.update(self.decoder.step_counters())
        for request in finished:
            self.decoder.release(request)
            delivered += self._deliver(self.scheduler.on_finished(request), now)
        shape = StepShape.EMPTY if output.feed is None else output.feed.shape
        record = StepRecord(
            step=output.step,
            t_start=output.t_start,
            t_end=self.clock(),
            model_s=output.model_s,
            num_seqs=len(plan.seqs),
            prefill_tokens=prefill,
            decode_tokens=decode,
            waiting=self.scheduler.num_waiting(),
            running=running,
            kv_allocated_slots=kv.allocated_slots,
            kv_live_slots=kv.live_slots,
            kv_total_slots=kv.total_slots,
            kv_waste=kv.waste,
            preempted=len(plan.preempted),
            pad_tokens=pad,
            delivered=len(delivered),
            logits_rows=shape.num_logits,
            attended_pairs=shape.attended_pairs,
            context_tokens=shape.context_tokens,
            counters=counters,
        )
        return StepResult(delivered, record, shape)

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
                self.kv.truncate(request, valid)
            if request.is_finished:
                finished.append(request)
        return finished

    def _fork(self, forks: dict[Request, list[Fork]], now: float) -> list[Request]:
        """Start the other samples of each request whose first token was just appended, from
        its computed prompt; the samples that finished with their first token."""
        finished = []
        for parent, samples in forks.items():
            for fork in samples:
                sample = fork.sample
                parent.samples.append(sample)
                self._append(sample, [fork.first_token], now)
                self.scheduler.fork(parent, sample)
                if sample.is_finished:
                    finished.append(sample)
        return finished

    def _deliver(self, samples: list[Request], now: float) -> list[Request]:
        """Deliver, now, every request whose last sample is among `samples`."""
        delivered = self.groups.complete(samples)
        for request in delivered:
            request.deliver(now)
        return delivered

    def _append(self, request: Request, tokens: list[int], now: float) -> int:
        """Append tokens until one stops the request; how many were appended."""
        output_ids, sampling = request.output_ids, request.sampling
        for count, token in enumerate(tokens, start=1):
            output_ids.append(token)
            request.token_times.append(now)
            if token in self.stop_token_ids and not sampling.ignore_eos:
                request.finish("stop")
                return count
            if len(output_ids) >= sampling.max_tokens or request.num_tokens >= self.max_context:
                request.finish("length")
                return count
        return len(tokens)


def _advance(seqs: list[ScheduledSeq]) -> tuple[int, int, int]:
    """Move each sequence's computed count on by the tokens it fed; the (prefill, decode,
    padding) tokens the batch fed, each sequence read before it moved: a sequence feeding from
    its last known token after its prompt is decoding."""
    prefill = decode = pad = 0
    for seq in seqs:
        request = seq.request
        pad += seq.num_pad_tokens
        computed, known = request.num_computed_tokens, request.num_tokens
        if computed == known - 1 and known > request.prompt_len:
            decode += seq.num_new_tokens
        else:
            prefill += seq.num_new_tokens
        request.num_computed_tokens = computed + seq.num_new_tokens
    return prefill, decode, pad
