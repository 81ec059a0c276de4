"""Iteration-level scheduling (Orca): re-plan the batch at every step.

Every step, running requests go first, in arrival order: a decode contributes one token, an
unfinished prompt its remaining tokens (or, with chunked prefill, as many as the step's
token budget still allows, Sarathi-style). Then waiting requests are admitted first come,
first served, while the KV manager can place them and `max_num_seqs` and
`max_num_batched_tokens` allow. A finished request leaves at once and frees its KV. When
the KV manager cannot grow a running request, the most recently admitted running request is
preempted: its KV is freed (recompute) or moved to host memory (swap, where the KV manager
supports it), and it goes back to the head of the queue.
"""

from __future__ import annotations

from harness.engine.request import Request, RequestState
from strategies.batching.base import ScheduledSeq, Scheduler, SchedulerOutput


class IterationScheduler(Scheduler):
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
        if not out.preempted:
            self._admit(out, budget)
        return out

    def _tokens_this_step(self, request: Request, budget: int, scheduled: list) -> int:
        remaining = request.num_tokens - request.num_computed_tokens
        if self.limits.chunked_prefill:
            return min(remaining, budget)
        if remaining > budget and scheduled:
            return 0  # a whole prompt that does not fit this step waits for the next
        return remaining

    def _admit(self, out: SchedulerOutput, budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.limits.max_num_seqs:
            request = self.waiting[0]
            if not self.kv.admit(request):
                return
            count = self._tokens_this_step(request, budget, out.seqs)
            if count == 0 or not self.kv.grow(request, count):
                self.kv.free(request)
                return
            self.waiting.popleft()
            request.state = RequestState.RUNNING
            self.running.append(request)
            out.seqs.append(ScheduledSeq(request, count))
            budget -= count

    def on_finished(self, request: Request) -> None:
        self.running.remove(request)
        self.kv.free(request)
