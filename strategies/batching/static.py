"""Static batching, as FasterTransformer served: form a batch, run it to completion, repeat.

Up to `max_num_seqs` waiting requests that the KV manager can place form a batch. The batch
prefills together, then decodes one token per unfinished member per step until every
member has finished; only then are its KV reservations freed and the next batch formed. A
member that finishes early keeps its slots, idle, and a request that arrives meanwhile
waits for the whole batch: that is the cost this strategy exists to show.
"""

from __future__ import annotations

from harness.request import Request, RequestState
from strategies.batching.base import ScheduledSeq, Scheduler, SchedulerOutput


class StaticScheduler(Scheduler):
    def schedule(self) -> SchedulerOutput:
        if not self.running:
            self._form_batch()
            return SchedulerOutput(
                [ScheduledSeq(r, r.num_tokens - r.num_computed_tokens) for r in self.running]
            )
        active = [r for r in self.running if not r.is_finished]
        return SchedulerOutput([ScheduledSeq(r, 1) for r in active])

    def _form_batch(self) -> None:
        while self.waiting and len(self.running) < self.limits.max_num_seqs:
            if not self.kv.admit(self.waiting[0]):
                break
            request = self.waiting.popleft()
            request.state = RequestState.RUNNING
            self.running.append(request)

    def on_finished(self, request: Request) -> None:
        if all(r.is_finished for r in self.running):
            for member in self.running:
                self.kv.free(member)
            self.running = []
