"""Drafting with a network (`layerskip`, `draft`): gamma autoregressive draft steps per engine
step, over the drafter's own KV cache, batched across the requests that speculate.

Each target request has a shadow request in the drafter's KV manager: it shares the target
request's token lists (so it always sees the verified tokens) and has its own
`num_computed_tokens`, the drafter's progress. A step of proposals:

1. rolls every shadow back to the target's verified tokens (`truncate`: the drafter's cache
   forgets its rejected drafts and, paged, returns the blocks past them), then admits shadows
   for requests new to the drafter (a prefix-cache hit there skips drafter prefill) and grows
   each by what this step will feed: the tokens it has not seen yet and gamma - 1 drafts;
2. runs draft step 1 on every shadow's unseen tokens (its catch-up: after a verification, the
   accepted drafts it had not fed and the target's own token; at first, the whole prompt),
   then draft steps 2..gamma on one token each, sampling each draft as the request samples
   (greedy, or its temperature / top-k / top-p on a stream of its own).

Only verified tokens are ever registered in the drafter's prefix cache: blocks register when
a shadow grows or is freed, and by then it has been rolled back. A request whose shadow finds
no room in the drafter's cache drafts nothing that step (counted as `spec_draft_no_room`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from servelab.engine.kv_manager import KVManager
from servelab.engine.model_runner import Feed, ModelRunner
from servelab.engine.request import Request
from servelab.engine.sampler import DRAFT_STREAM, draw, generator_for, probabilities
from servelab.strategies.decoding.proposer import Proposal, Proposer, Want


@dataclass
class _Drafting:
    """One request drafting this step: its shadow, its gamma, what it has drafted so far."""

    request: Request
    shadow: Request
    gamma: int
    tokens: list[int]
    q_rows: list[torch.Tensor]


class ModelDrafter(Proposer):
    def __init__(self, runner: ModelRunner, kv: KVManager) -> None:
        self.runner = runner  # the drafting network over its own KV cache
        self.kv = kv
        self._shadows: dict[Request, Request] = {}
        self._no_room = 0
        self._forwards = 0

    def propose(self, wants: list[Want]) -> list[Proposal]:
        for request, shadow in self._shadows.items():
            self._roll_back(request, shadow)
        drafting: dict[Request, _Drafting] = {}
        for want in wants:
            room = self._room_for(want)
            if room is None:
                self._no_room += 1
            else:
                drafting[want.request] = _Drafting(want.request, room, want.gamma, [], [])
        for step in range(max((d.gamma for d in drafting.values()), default=0)):
            self._draft_step([d for d in drafting.values() if d.gamma > step], step)
        return [self._proposal(drafting.get(want.request)) for want in wants]

    def _roll_back(self, request: Request, shadow: Request) -> None:
        """Forget everything past the target's verified tokens but its last, which is fed
        again (the drafter needs its logits)."""
        verified = min(shadow.num_computed_tokens, request.num_tokens - 1)
        if verified < shadow.num_computed_tokens:
            self.kv.truncate(shadow, verified)

    def _room_for(self, want: Want) -> Request | None:
        """The request's shadow, admitted and grown for this step's feeds; None if no room."""
        request = want.request
        shadow = self._shadows.get(request)
        if shadow is None:
            shadow = Request(
                id=request.id,
                prompt_ids=request.prompt_ids,
                sampling=request.sampling,
                output_ids=request.output_ids,  # the same list: the shadow sees every token
            )
            if not self.kv.admit(shadow):
                return None
            self._shadows[request] = shadow
        unseen = request.num_tokens - shadow.num_computed_tokens
        if not self.kv.grow(shadow, unseen + want.gamma - 1):
            return None
        return shadow

    def _draft_step(self, drafting: list[_Drafting], step: int) -> None:
        starts, counts, ids, rows = [], [], [], []
        for entry in drafting:
            start = entry.shadow.num_computed_tokens
            if step == 0:
                fed = entry.request.token_slice(start, entry.request.num_tokens)
            else:
                fed = entry.tokens[-1:]
            starts.append(start)
            counts.append(len(fed))
            ids += fed
            rows.append(len(ids) - 1)
        shadows = [entry.shadow for entry in drafting]
        logits = self.runner.run(self.kv, Feed(shadows, starts, counts, ids, rows))
        self._forwards += 1
        greedy = logits.argmax(dim=-1).tolist()
        for entry, count, token, row in zip(drafting, counts, greedy, logits, strict=True):
            entry.shadow.num_computed_tokens += count
            params = entry.request.sampling
            if not params.greedy:
                probs = probabilities(row, params)
                index = len(entry.request.output_ids) + step
                token = draw(probs, generator_for(params, index, DRAFT_STREAM))
                entry.q_rows.append(probs / probs.sum())
            entry.tokens.append(token)

    @staticmethod
    def _proposal(entry: _Drafting | None) -> Proposal:
        if entry is None:
            return Proposal([])
        q = torch.stack(entry.q_rows) if entry.q_rows else None
        return Proposal(entry.tokens, q)

    def release(self, request: Request) -> None:
        shadow = self._shadows.pop(request, None)
        if shadow is not None:
            self._roll_back(request, shadow)  # freeing registers full blocks: verified only
            self.kv.free(shadow)

    def counters(self) -> dict[str, float]:
        counters: dict[str, float] = {
            "spec_draft_forwards": self._forwards,
            "spec_draft_no_room": self._no_room,
        }
        self._forwards = self._no_room = 0
        return counters
