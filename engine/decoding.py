"""The interface of the decoding axis: what a sequence feeds beyond its known tokens, and
which tokens a step's logits accept.

Standard decoding feeds each running sequence its last token and accepts one sampled token.
Speculative decoding proposes draft tokens before the step (`propose` sets
`Request.draft_ids`); the scheduler feeds them after the last known token, the target scores
every fed position in the same forward, and `accept` returns the tokens to append: the
accepted drafts and one token from the target. The engine then rolls the KV cache back past
the accepted length (`KVManager.truncate`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from servelab.engine.request import Request


@dataclass
class Verification:
    """A sequence whose next token is due: `num_drafts` drafts were fed after its last
    known token, so it has `num_drafts + 1` rows of logits, in position order."""

    request: Request
    num_drafts: int


class Decoder(ABC):
    """What the engine needs from a decoding strategy."""

    def propose(self, requests: list[Request]) -> None:
        """Before scheduling: set `draft_ids` on the running requests (none by default)."""
        del requests

    @abstractmethod
    def accept(self, logits: torch.Tensor, due: list[Verification]) -> list[list[int]]:
        """`logits` [rows, vocab] fp32, the rows of `due` one after another; for each
        verification the tokens to append (at least one)."""

    def release(self, request: Request) -> None:
        """Forget any state kept for a request that finished or was preempted."""
        del request

    def step_counters(self) -> dict[str, float | list[int]]:
        """Counters of the step just run, for its record (proposed, accepted, draft time, the
        count of verifications by tokens accepted)."""
        return {}
