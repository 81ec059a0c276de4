"""What both batching strategies share: the waiting queue, the running set, the admission
order, and preemption when the KV manager has no room.

Requests wait in arrival order. Preempted requests go back to the head of the queue and are
offered a place before anything new (they wait in a queue of their own, so that a step finds
them without looking through every waiting request); new requests are offered places in the
order of the strategy's admission policy. When a running request cannot grow, the most
recently admitted unfinished request is preempted (recompute, or swap where the KV manager
supports it). A cancelled request leaves the queue or the running set at once and returns
its KV.
Speculative drafts are fed only where room is left (`add_drafts`): they never preempt.
A request for n samples takes n places (`Request.seats`) when admitted; its other samples
join the running set when its prompt is computed, sharing or copying its KV, or, where the KV
manager has no room for them, wait at the head of the queue to compute their prompt again.
"""

from __future__ import annotations

from collections import deque

from servelab.base.errors import ConfigError
from servelab.engine.kv_manager import KVManager
from servelab.engine.request import Request, RequestState
from servelab.engine.scheduling import (
    AdmissionPolicy,
    ScheduledSeq,
    Scheduler,
    SchedulerLimits,
    SchedulerOutput,
)


class QueueScheduler(Scheduler):
    def __init__(self, kv: KVManager, limits: SchedulerLimits, policy: AdmissionPolicy) -> None:
        self.kv = kv
        self.limits = limits
        self.policy = policy
        self.resumed: deque[Request] = deque()  # preempted, the most recently preempted first
        self.fresh: deque[Request] = deque()  # every other waiting request, as queued
        self.running: list[Request] = []

    @property
    def waiting(self) -> list[Request]:
        """Every waiting request: the preempted ones first, then the rest as queued."""
        return [*self.resumed, *self.fresh]

    def add(self, request: Request) -> None:
        request.state = RequestState.WAITING
        self.fresh.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.resumed or self.fresh or self.running)

    def limit_error(self, request: Request) -> ConfigError | None:
        if request.sampling.n <= self.limits.max_num_seqs:
            return None
        return ConfigError(
            "engine.max_batch_size",
            f"request {request.id} asks for {request.sampling.n} samples, more than one batch "
            f"holds ({self.limits.max_num_seqs})",
        )

    def seats_taken(self) -> int:
        """Places of `max_num_seqs` the running set holds (n for a request yet to fork)."""
        return sum(r.seats for r in self.running)

    def fork(self, parent: Request, sample: Request) -> None:
        if self.kv.fork(parent, sample):
            sample.state = RequestState.RUNNING
            self.running.append(sample)
        else:
            sample.state = RequestState.WAITING
            self.fresh.appendleft(sample)

    def cancel(self, request: Request) -> None:
        if request in self.resumed:
            self.resumed.remove(request)
        elif request in self.fresh:
            self.fresh.remove(request)
        elif request in self.running:
            self.running.remove(request)
        if self.kv.holds(request):
            self.kv.free(request)

    def num_waiting(self) -> int:
        return len(self.resumed) + len(self.fresh)

    def num_running(self) -> int:
        return sum(1 for r in self.running if not r.is_finished)

    def running_requests(self) -> list[Request]:
        return [r for r in self.running if not r.is_finished]

    def admission_order(self) -> list[Request]:
        """Preempted requests first, as they were queued; then the policy's order."""
        if not self.fresh:
            return list(self.resumed)
        ordered = self.policy.order(self.fresh, self.kv)
        return [*self.resumed, *ordered] if self.resumed else ordered

    def start_running(self, request: Request) -> None:
        """Move an admitted request from its queue to the running set."""
        queue = self.resumed if request.state is RequestState.PREEMPTED else self.fresh
        if queue and queue[0] is request:
            queue.popleft()
        else:
            queue.remove(request)
        request.state = RequestState.RUNNING
        self.running.append(request)

    def add_drafts(self, seqs: list[ScheduledSeq], budget: int | None) -> None:
        """Feed the drafts of sequences that feed all their known tokens, in order, while
        the token budget (None: no limit) and the KV manager have room. A draft is only a
        guess: it never preempts a request and never takes a request's own place."""
        for seq in seqs:
            request = seq.request
            known = request.num_tokens - request.num_computed_tokens
            drafts = len(request.draft_ids)
            if budget is not None:
                drafts = min(drafts, budget)
            if drafts == 0 or seq.num_new_tokens != known:
                continue
            while drafts and not self.kv.grow(request, known + drafts):
                drafts -= 1
            seq.num_new_tokens += drafts
            if budget is not None:
                budget -= drafts

    def grow_or_preempt(self, request: Request, count: int, out: SchedulerOutput) -> bool:
        """Make room for `count` more tokens of `request`, preempting the most recently
        admitted unfinished request while the KV manager has none; False if `request`
        itself had to go."""
        while not self.kv.grow(request, count):
            victim = next(r for r in reversed(self.running) if not r.is_finished)
            self.running.remove(victim)
            self.kv.preempt(victim)
            victim.state = RequestState.PREEMPTED
            victim.preemptions += 1
            victim.draft_ids = []
            self.resumed.appendleft(victim)
            out.preempted.append(victim)
            if victim is request:
                return False
        return True
