"""Static batching, as FasterTransformer served: form a batch, run it to completion, repeat.

Waiting requests (up to `max_num_seqs` places that the KV manager can place, n for a request
for n samples, whose other samples join the batch once its prompt is computed) form a batch,
which prefills together and then decodes one step per token until every member has
finished; only then is the next batch formed, so a request that arrives meanwhile waits for
the whole batch. Three switches, all on in the `fastertransformer` preset, make it behave as that
baseline did, and can be turned off one by one to see what each costs:

- `return_at=batch_end`: a member's response is delivered when its batch ends, not when its
  own last token is out (`own_finish`).
- `pad_finished`: a finished member keeps its row until the batch ends, fed a padding token
  each step at its last position (its output discarded): its compute is still spent, and
  its KV stays held. Off, a finished member leaves the compute and frees its KV at once.
- `pad_prompts`: the batch's prompts are padded to its longest at prefill. Padding goes on
  the right, after each prompt, so its keys and values are overwritten by the decode steps
  and real outputs are unchanged; a KV manager that reserves up front reserves each member
  at least the padded length, as the rectangular batch buffers did.

Over paged KV (which allocates as tokens arrive) a member that cannot grow is preempted back
to the queue; a batch whose remaining members were all preempted ends, and they rejoin the
next one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from servelab.engine.kv_manager import KVManager
from servelab.engine.request import Request
from servelab.engine.scheduling import (
    AdmissionPolicy,
    ScheduledSeq,
    SchedulerLimits,
    SchedulerOutput,
)
from servelab.strategies.batching.base import QueueScheduler
from servelab.strategies.registry import Option

if TYPE_CHECKING:
    from servelab.strategies.factories import BatchingOption


@dataclass(frozen=True)
class StaticConfig:
    return_at: str = field(
        default="batch_end",
        metadata={
            "choices": ("batch_end", "own_finish"),
            "help": "when a member's response is delivered",
        },
    )
    pad_finished: bool = field(
        default=True, metadata={"help": "finished members keep computing padding until the end"}
    )
    pad_prompts: bool = field(
        default=True, metadata={"help": "pad the batch's prompts to its longest at prefill"}
    )


class StaticScheduler(QueueScheduler):
    def __init__(
        self, config: StaticConfig, kv: KVManager, limits: SchedulerLimits, policy: AdmissionPolicy
    ) -> None:
        super().__init__(kv, limits, policy)
        self.config = config
        self._released: set[Request] = set()  # members whose KV was freed before the batch end

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        if self.running:
            self._continue_batch(out)
            if not self.num_running():  # every member left was preempted: the batch is over
                out.seqs = []
                out.delivered = self._end_batch()
        if not self.running:
            self._form_batch(out)
        return out

    def _continue_batch(self, out: SchedulerOutput) -> None:
        for request in self.running_requests():
            count = request.num_tokens - request.num_computed_tokens
            if request in self.running and self.grow_or_preempt(request, count, out):
                out.seqs.append(ScheduledSeq(request, count))
        self.add_drafts(out.seqs, None)
        if not self.config.pad_finished:
            return
        for member in self.running:
            if member.is_finished and self.kv.grow(member, 1):
                out.seqs.append(ScheduledSeq(member, 0, 1))

    def _form_batch(self, out: SchedulerOutput) -> None:
        candidates = self._seated(self.admission_order())
        width = max((r.num_tokens for r in candidates), default=0)
        reserve = width if self.config.pad_prompts else 0
        for request in candidates:
            if not self.kv.admit(request, reserve):
                break
            count = request.num_pending_tokens
            pad = max(0, width - request.num_computed_tokens - count) if reserve else 0
            if not self.kv.grow(request, count + pad):
                self.kv.free(request)
                break
            self.start_running(request)
            out.seqs.append(ScheduledSeq(request, count, pad))
        if self.config.pad_prompts:  # pad to the longest prompt of the batch actually formed
            width = max((s.request.num_tokens for s in out.seqs), default=0)
            for seq in out.seqs:
                seq.num_pad_tokens = width - seq.request.num_computed_tokens - seq.num_new_tokens

    def _seated(self, order: list[Request]) -> list[Request]:
        """The leading requests of `order` whose places (n for n samples) fit one batch."""
        seats = 0
        for count, request in enumerate(order):
            seats += request.seats
            if seats > self.limits.max_num_seqs:
                return order[:count]
        return order

    def on_finished(self, request: Request) -> list[Request]:
        if self.num_running():
            if not self.config.pad_finished:
                self.kv.free(request)
                self._released.add(request)
            return [request] if self.config.return_at == "own_finish" else []
        delivered = self._end_batch()
        return delivered if self.config.return_at == "batch_end" else [request]

    def cancel(self, request: Request) -> None:
        """Drop `request`; if it was the batch's last unfinished member and no response is
        held for the batch's end, the batch is over now (otherwise the next step would find
        nothing to run and nothing to deliver while members still hold their places)."""
        super().cancel(request)
        self._released.discard(request)
        if self.running and not self.num_running() and self.config.return_at == "own_finish":
            self._end_batch()

    def _end_batch(self) -> list[Request]:
        """Free every member still holding KV; the members whose responses were held."""
        members, self.running = self.running, []
        for member in members:
            if member not in self._released:
                self.kv.free(member)
        self._released.clear()
        return members if self.config.return_at == "batch_end" else []


STATIC: BatchingOption = Option(
    name="static",
    summary="FasterTransformer: form a batch, run it to completion (held responses, padding)",
    config=StaticConfig,
    build=StaticScheduler,
)
