"""The interface of the batching axis: decide, each step, who runs and how far.

A scheduler owns the waiting queue and the running set and makes every admission and
eviction decision, asking its KV manager for room. For one engine step it returns the
requests to run and how many tokens each feeds: its known-but-uncomputed tokens and any
drafts to verify, plus padding rows where the strategy pads by definition (static batching).
The engine tells it when a request finishes; the scheduler answers which responses are
delivered now (static batching may hold them until its batch ends). A request for n samples
holds n of the `max_num_seqs` places from its admission (`Request.seats`), and its other
samples join the batch beside it once its prompt is computed (`fork`). An admission policy
orders the waiting requests a scheduler considers.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

from servelab.base.errors import ConfigError
from servelab.engine.kv_manager import KVManager
from servelab.engine.request import Request


@dataclass(frozen=True)
class SchedulerLimits:
    """The engine's per-step limits every scheduler respects."""

    max_num_seqs: int  # requests in one step (engine.max_batch_size)
    max_num_batched_tokens: int  # tokens fed in one step (iteration batching)


@dataclass
class ScheduledSeq:
    """One sequence of a step: `num_new_tokens` real tokens from `num_computed_tokens` on,
    then `num_pad_tokens` padding tokens whose outputs are discarded."""

    request: Request
    num_new_tokens: int
    num_pad_tokens: int = 0


@dataclass
class SchedulerOutput:
    seqs: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    delivered: list[Request] = field(default_factory=list)  # held responses released now


class AdmissionPolicy(ABC):
    """The order in which waiting requests are offered a place (`strategy.policy`)."""

    @abstractmethod
    def order(self, waiting: Sequence[Request], kv: KVManager) -> list[Request]:
        """`waiting` (in arrival order) in the order to try them."""


class Scheduler(ABC):
    """What the engine needs from a batching strategy."""

    kv: KVManager

    @abstractmethod
    def add(self, request: Request) -> None:
        """A request arrived."""

    def limit_error(self, request: Request) -> ConfigError | None:
        """Why this strategy's limits can never schedule `request` (None: they can)."""
        del request
        return None

    @abstractmethod
    def cancel(self, request: Request) -> None:
        """Forget `request` wherever it is (waiting, running, held) and return its KV."""

    @abstractmethod
    def has_unfinished(self) -> bool:
        """Anything waiting, running, or finished but not yet delivered?"""

    @abstractmethod
    def schedule(self) -> SchedulerOutput:
        """This step's batch; empty when nothing can run."""

    @abstractmethod
    def fork(self, parent: Request, sample: Request) -> None:
        """`sample`, another sample of running `parent`, starts from `parent`'s computed
        prompt (parallel sampling): beside it in the batch, or waiting if there is no room."""

    @abstractmethod
    def on_finished(self, request: Request) -> list[Request]:
        """`request` has just finished; the requests whose responses are delivered now."""

    @abstractmethod
    def num_waiting(self) -> int:
        """Requests waiting for a place (preempted ones included)."""

    @abstractmethod
    def num_running(self) -> int:
        """Unfinished requests holding a place in the batch."""

    @abstractmethod
    def running_requests(self) -> list[Request]:
        """Unfinished requests holding a place, in admission order (drafts are proposed
        for these)."""
