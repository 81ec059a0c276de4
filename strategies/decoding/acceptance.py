"""Which drafts the target accepts, and the token it adds (Leviathan et al., 2023).

The target scored the last known token and each fed draft in one forward: row i of `logits`
is its next-token distribution after draft i (row 0: after the last known token).

- Greedy: accept drafts while each equals the target's argmax at its position; then append
  the target's argmax at the first mismatch (or after the last draft). The output is exactly
  greedy decoding's.
- Sampling: with p_i and q_i the target's and the draft's distributions at position i (the
  same temperature / top-k / top-p applied to both; a certain draft has a one-hot q), accept
  draft d_i with probability min(1, p_i(d_i) / q_i(d_i)); at the first rejection, draw from
  norm(max(0, p_i - q_i)) and stop; if every draft passes, draw a bonus token from p_k. Every
  appended token is then distributed exactly as the target's sampling would draw it.

Each position's draws (the uniform, then any residual draw) come from the request's generator
for that output index, so the outcome does not depend on batch composition; with no drafts
the one draw is exactly plain sampling's.
"""

from __future__ import annotations

import torch

from servelab.engine.request import SamplingParams
from servelab.engine.sampler import draw, generator_for, probabilities


def accept_greedy(logits: torch.Tensor, drafts: list[int]) -> list[int]:
    """The accepted drafts and the target's token, for `logits` [len(drafts) + 1, vocab]."""
    best = logits.argmax(dim=-1).tolist()
    accepted = 0
    while accepted < len(drafts) and drafts[accepted] == best[accepted]:
        accepted += 1
    return drafts[:accepted] + [best[accepted]]


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """What to draw from after rejecting a draft: max(0, p - q) (normalised by the draw)."""
    return (p - q).clamp(min=0.0)


def accept_sampled(
    logits: torch.Tensor,
    drafts: list[int],
    q: torch.Tensor | None,
    params: SamplingParams,
    first_index: int,
) -> list[int]:
    """The accepted drafts and one drawn token; `q` [len(drafts), vocab] normalised draft
    distributions (None: one-hot on each draft); `first_index`: the output index of the first
    token appended."""
    tokens: list[int] = []
    for i, draft in enumerate(drafts):
        p = _normalised(probabilities(logits[i], params))
        q_i = torch.zeros_like(p).index_fill_(0, torch.tensor([draft]), 1.0) if q is None else q[i]
        generator = generator_for(params, first_index + i)
        uniform = float(torch.rand((), generator=generator))
        if uniform * float(q_i[draft]) < float(p[draft]):
            tokens.append(draft)
            continue
        rest = residual(p, q_i)
        tokens.append(draw(rest if float(rest.sum()) > 0 else p, generator))
        return tokens
    last = len(drafts)
    bonus = probabilities(logits[last], params)
    tokens.append(draw(bonus, generator_for(params, first_index + last)))
    return tokens


def _normalised(probs: torch.Tensor) -> torch.Tensor:
    return probs / probs.sum()
