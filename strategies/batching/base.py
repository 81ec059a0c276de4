"""The interface every batching strategy implements: decide, each step, who runs and how far.

A scheduler owns the waiting queue and the running set and makes all admission and
eviction decisions, asking its KV manager for room. It returns, for one engine step, the
requests to run and how many new tokens each contributes. The engine tells it when a
request finishes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass, field

from harness.engine.kv_manager import KVManager
from harness.engine.request import Request, RequestState


@dataclass(frozen=True)
class SchedulerLimits:
    max_num_seqs: int  # requests in one step (engine.max_batch_size)
    max_num_batched_tokens: int  # new tokens in one step (iteration batching)
    chunked_prefill: bool = False


@dataclass
class ScheduledSeq:
    request: Request
    num_new_tokens: int


@dataclass
class SchedulerOutput:
    seqs: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)


class Scheduler(ABC):
    def __init__(self, kv: KVManager, limits: SchedulerLimits) -> None:
        self.kv = kv
        self.limits = limits
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    def add(self, request: Request) -> None:
        request.state = RequestState.WAITING
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

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
            self.waiting.appendleft(victim)
            out.preempted.append(victim)
            if victim is request:
                return False
        return True

    @abstractmethod
    def schedule(self) -> SchedulerOutput:
        """This step's batch; empty when nothing can run."""

    @abstractmethod
    def on_finished(self, request: Request) -> None:
        """`request` has just finished (stop token, length, or error)."""
