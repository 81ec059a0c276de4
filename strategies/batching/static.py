"""Static batching, as FasterTransformer served: form a batch, run it to completion, repeat.

Up to `max_num_seqs` waiting requests that the KV manager can place form a batch. The batch
prefills together, then decodes one token per unfinished member per step until every
member has finished; only then are its KV reservations freed and the next batch formed. A
member that finishes early keeps its slots, idle, and a request that arrives meanwhile
waits for the whole batch: that is the cost this strategy exists to show. Over paged KV
(which allocates as tokens arrive) a member that cannot grow is preempted back to the
queue, as iteration batching does, and rejoins in a later batch.
"""

from __future__ import annotations

from harness.engine.request import Request, RequestState
from strategies.batching.base import ScheduledSeq, Scheduler, SchedulerOutput


class StaticScheduler(Scheduler):
    def schedule(self) -> SchedulerOutput:
        if not self.running:
            return self._form_batch()
        out = SchedulerOutput()
        for request in [r for r in self.running if not r.is_finished]:
            if request in self.running and self.grow_or_preempt(request, 1, out):
                out.seqs.append(ScheduledSeq(request, 1))
        return out

    def _form_batch(self) -> SchedulerOutput:
        out = SchedulerOutput()
        while self.waiting and len(self.running) < self.limits.max_num_seqs:
            request = self.waiting[0]
            if not self.kv.admit(request):
                break
            count = request.num_tokens - request.num_computed_tokens
            if not self.kv.grow(request, count):
                self.kv.free(request)
                break
            self.waiting.popleft()
            request.state = RequestState.RUNNING
            self.running.append(request)
            out.seqs.append(ScheduledSeq(request, count))
        return out

    def on_finished(self, request: Request) -> None:
        if all(r.is_finished for r in self.running):
            for member in self.running:
                self.kv.free(member)
            self.running = []
