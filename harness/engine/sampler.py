"""Pick each sequence's next token from its logits: greedy, or temperature / top-k / top-p.

Random sampling draws from a generator seeded by (request seed, output index), so a
request's tokens do not depend on which other requests shared its batch.
"""

from __future__ import annotations

import torch

from harness.engine.request import Request


def sample(logits: torch.Tensor, requests: list[Request]) -> list[int]:
    """One token per row of `logits` [S, vocab] (fp32), for the matching request."""
    greedy = logits.argmax(dim=-1).tolist()
    return [
        token if request.sampling.greedy else _sample_one(row, request)
        for token, row, request in zip(greedy, logits, requests, strict=True)
    ]


def _sample_one(logits: torch.Tensor, request: Request) -> int:
    params = request.sampling
    scaled = logits.float() / params.temperature
    if params.top_k > 0:
        kth = torch.topk(scaled, min(params.top_k, scaled.numel())).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        before = sorted_probs.cumsum(0) - sorted_probs
        sorted_probs = sorted_probs.masked_fill(before >= params.top_p, 0.0)
        probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
    generator = torch.Generator(device=probs.device)
    generator.manual_seed(params.seed * 1_000_003 + len(request.output_ids))
    return int(torch.multinomial(probs, 1, generator=generator).item())
