"""Iteration-level scheduling (Orca): re-plan the batch at every step.

Every step, running requests go first, in admission order: a decode feeds its last token
(and any drafts to verify), an unfinished prompt its remaining tokens or, with chunked
prefill, as many as the step's token budget still allows (Sarathi-style). Then waiting
requests are offered places in admission order while the KV manager can place them and
`max_num_seqs` and `max_num_batched_tokens` allow; the first that does not fit waits at the
head of the queue. A step that preempts admits nobody, unless nothing else would run. A
finished request leaves at once, frees its KV, and its response is delivered. Speculative
drafts come last: what budget is left after every request's own tokens goes to the scheduled
sequences' drafts, in order, where the KV manager has room.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from servelab.base.errors import ConfigError
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
class IterationConfig:
    chunked_prefill: bool = field(
        default=False, metadata={"help": "split long prompts across steps under the token budget"}
    )


class IterationScheduler(QueueScheduler):
    def __init__(
        self,
        config: IterationConfig,
        kv: KVManager,
        limits: SchedulerLimits,
        policy: AdmissionPolicy,
    ) -> None:
        super().__init__(kv, limits, policy)
        self.config = config

    def limit_error(self, request: Request) -> ConfigError | None:
        budget = self.limits.max_num_batched_tokens
        if self.config.chunked_prefill or request.prompt_len <= budget:
            return super().limit_error(request)
        return ConfigError(
            "engine.max_num_batched_tokens",
            f"request {request.id} has a prompt of {request.prompt_len} tokens, more than one "
            f"step may feed ({budget}); raise it or set strategy.chunked_prefill=true",
        )

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.limits.max_num_batched_tokens
        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            count = self._tokens_this_step(request, budget, out.seqs)
            if count == 0:
                index += 1
                continue
            if not self.grow_or_preempt(request, count, out):
                break
            out.seqs.append(ScheduledSeq(request, count))
            budget -= count
            index += 1
        if not out.preempted or not out.seqs:
            # a step that preempts admits nothing, unless it would run nothing at all (a
            # lone request had to give its blocks up: it starts over at once, from whatever
            # the prefix cache kept, rather than leaving an empty step)
            budget = self._admit(out, budget)
        self.add_drafts(out.seqs, budget)
        return out

    def _tokens_this_step(self, request: Request, budget: int, scheduled: list) -> int:
        """The request's own (known, not yet computed) tokens this step may feed."""
        known = request.num_tokens - request.num_computed_tokens
        if self.config.chunked_prefill:
            return min(known, budget)
        if known > budget:
            # a whole prompt waits for a step with room; alone, it runs (a recomputed
            # sequence may have outgrown the budget since its prompt was admitted)
            return 0 if scheduled else known
        return known

    def _admit(self, out: SchedulerOutput, budget: int) -> int:
        """Admit waiting requests while they fit; the token budget left."""
        seats = self.seats_taken()
        for request in self.admission_order():
            if budget <= 0 or seats + request.seats > self.limits.max_num_seqs:
                break
            if not self.kv.admit(request):
                break
            count = self._tokens_this_step(request, budget, out.seqs)
            if count == 0 or not self.kv.grow(request, count):
                self.kv.free(request)
                break
            self.start_running(request)
            out.seqs.append(ScheduledSeq(request, count))
            budget -= count
            seats += request.seats
        return budget

    def on_finished(self, request: Request) -> list[Request]:
        self.running.remove(request)
        self.kv.free(request)
        return [request]


ITERATION: BatchingOption = Option(
    name="iteration",
    summary="Orca: re-plan every step; finished requests leave, waiting ones join",
    config=IterationConfig,
    build=IterationScheduler,
)
