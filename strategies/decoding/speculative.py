"""`speculative` decoding (Leviathan et al., 2023): a cheaper proposer drafts gamma tokens, the
target verifies them all in one forward, and the acceptance rule keeps its output exact.

At the start of every step each running request that is past its first token gets up to
gamma drafts (`strategy.gamma`, fixed or adaptive: `strategies.decoding.gamma`) from the
proposer (`strategy.proposer`): `ngram` (prompt lookup), `layerskip` (the target's first
`strategy.layerskip_layers` layers) or `draft` (a separate model, `strategy.draft_model` with
`strategy.draft_weights`). The scheduler feeds [last token, drafts...] in the same forward as
other requests' prefill and decode, trimming drafts to the step's token budget first; the
acceptance rule (`strategies.decoding.acceptance`) returns the accepted drafts and one target
token, and the engine rolls the KV cache back past the rejected ones.

Counters, per step (`steps.jsonl`) and per request (`requests.jsonl`): `spec_proposed`
(drafts the target verified), `spec_accepted`, `spec_decode_seqs` (target forwards of
sequences past their first token, drafting or not) and `spec_emitted` (tokens those produced),
`spec_accepted_counts` (per step: how many verifications accepted 0, 1, 2, ... drafts) and
`spec_draft_s` (seconds spent proposing, against the step's `model_s` for the target).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from servelab.engine.decoding import Decoder, Verification
from servelab.engine.request import Request
from servelab.strategies.decoding.acceptance import accept_greedy, accept_sampled
from servelab.strategies.decoding.context import DecoderContext
from servelab.strategies.decoding.gamma import RULES, choose_gamma
from servelab.strategies.decoding.proposer import Proposer, Want
from servelab.strategies.registry import Option

if TYPE_CHECKING:
    from servelab.strategies.factories import DecodingOption


@dataclass(frozen=True)
class SpeculativeConfig:
    gamma: int = field(default=4, metadata={"minimum": 1, "help": "drafts per step (the most)"})
    gamma_rule: str = field(
        default="fixed",
        metadata={"choices": RULES, "help": "fixed gamma, or adaptive from the acceptance rate"},
    )
    gamma_cost: float = field(
        default=0.1,
        metadata={"minimum": 0.0, "help": "adaptive: one draft token's cost / a target step"},
    )


class SpeculativeDecoder(Decoder):
    def __init__(self, config: SpeculativeConfig, proposer: Proposer, max_context: int) -> None:
        self.config = config
        self.proposer = proposer
        self.max_context = max_context
        self._q: dict[Request, torch.Tensor] = {}  # draft distributions of sampled requests
        self._counters = _StepCounters()

    def propose(self, requests: list[Request]) -> None:
        start = time.perf_counter()
        self._q.clear()
        wants = []
        for request in requests:
            request.draft_ids = []
            gamma = choose_gamma(
                request,
                self.config.gamma_rule,
                self.config.gamma,
                self.config.gamma_cost,
                self.max_context,
            )
            if gamma > 0:
                wants.append(Want(request, gamma))
        if wants:
            for want, proposal in zip(wants, self.proposer.propose(wants), strict=True):
                want.request.draft_ids = proposal.tokens
                if proposal.q is not None:
                    self._q[want.request] = proposal.q
        self._counters.draft_s += time.perf_counter() - start

    def accept(self, logits: torch.Tensor, due: list[Verification]) -> list[list[int]]:
        accepted: list[list[int]] = []
        row = 0
        for verification in due:
            request, count = verification.request, verification.num_drafts
            rows = logits[row : row + count + 1]
            row += count + 1
            drafts = request.draft_ids[:count]
            if request.sampling.greedy:
                tokens = accept_greedy(rows, drafts)
            else:
                q = self._q.get(request)
                first = len(request.output_ids)
                tokens = accept_sampled(
                    rows, drafts, None if q is None else q[:count], request.sampling, first
                )
            if request.output_ids:
                self._counters.add(request, count, len(tokens))
            accepted.append(tokens)
        return accepted

    def release(self, request: Request) -> None:
        self._q.pop(request, None)
        self.proposer.release(request)

    def step_counters(self) -> dict[str, float | list[int]]:
        done, self._counters = self._counters, _StepCounters()
        return {**done.as_record(), **self.proposer.counters()}


@dataclass
class _StepCounters:
    proposed: int = 0
    accepted: int = 0
    decode_seqs: int = 0
    emitted: int = 0
    accepted_counts: list[int] = field(default_factory=list)
    draft_s: float = 0.0

    def add(self, request: Request, drafts: int, emitted: int) -> None:
        """A sequence past its first token was verified with `drafts` drafts fed and got
        `emitted` tokens (the accepted drafts and the target's)."""
        accepted = emitted - 1
        self.decode_seqs += 1
        self.emitted += emitted
        counters = request.counters
        counters["spec_decode_seqs"] = counters.get("spec_decode_seqs", 0) + 1
        counters["spec_emitted"] = counters.get("spec_emitted", 0) + emitted
        if drafts == 0:
            return
        self.proposed += drafts
        self.accepted += accepted
        if len(self.accepted_counts) <= accepted:
            self.accepted_counts += [0] * (accepted + 1 - len(self.accepted_counts))
        self.accepted_counts[accepted] += 1
        counters["spec_proposed"] = counters.get("spec_proposed", 0) + drafts
        counters["spec_accepted"] = counters.get("spec_accepted", 0) + accepted

    def as_record(self) -> dict[str, float | list[int]]:
        return {
            "spec_proposed": self.proposed,
            "spec_accepted": self.accepted,
            "spec_decode_seqs": self.decode_seqs,
            "spec_emitted": self.emitted,
            "spec_accepted_counts": self.accepted_counts,
            "spec_draft_s": self.draft_s,
        }


def build_speculative(config: SpeculativeConfig, context: DecoderContext) -> SpeculativeDecoder:
    if context.draft_source is None:
        raise RuntimeError("speculative decoding needs a proposer; build_engine gave none")
    proposer = context.draft_source.build(context)
    return SpeculativeDecoder(config, proposer, context.target.config.max_context)


SPECULATIVE: DecodingOption = Option(
    name="speculative",
    summary="a proposer drafts gamma tokens, the target verifies them in one pass (lossless)",
    config=SpeculativeConfig,
    build=build_speculative,
)
