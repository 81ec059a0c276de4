"""The interface every speculative proposer implements: draft tokens for running requests.

A proposer is asked, at the start of a step, for up to `gamma` tokens that may follow each
listed request's known tokens. It returns them with the distributions they were drawn from
(`q`, one row per token, normalised), which the sampling acceptance rule divides by; a
proposer whose tokens are certain (a lookup, or a greedy draft) returns `q = None`, read as
one-hot. A proposer that keeps per-request state (a draft KV cache) forgets it on `release`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from servelab.engine.request import Request


@dataclass
class Proposal:
    tokens: list[int]
    q: torch.Tensor | None = None  # [len(tokens), vocab] fp32, or None: one-hot on each token


@dataclass(frozen=True)
class Want:
    """A request that may speculate this step, and the most tokens it may draft."""

    request: Request
    gamma: int


class Proposer(ABC):
    @abstractmethod
    def propose(self, wants: list[Want]) -> list[Proposal]:
        """One proposal per want, in order (possibly empty)."""

    def release(self, request: Request) -> None:
        """Forget what is kept for a request that finished or was preempted."""
        del request

    def counters(self) -> dict[str, float]:
        """Proposer-specific counters of the step just proposed (reset on reading)."""
        return {}
