"""Pick each sequence's next token from its logits: greedy, or temperature / top-k / top-p.

Random sampling draws from a generator seeded by (request seed, sample index, output index,
stream), so a request's tokens do not depend on which other requests shared its batch, and
sample k of a request for n samples draws exactly what a single request with the same seed
and sample index k draws. Stream 0 is the target's own draws (plain sampling, and
speculative verification); a draft model samples its proposals from another stream, so that
a draft never correlates with the draw that verifies it. The four parts are hashed into the
seed: torch's CPU generator keeps only a seed's low 32 bits, so parts placed in high bits
(as an earlier stride of 2^40 between streams did) would all seed the same draws.
`probabilities` is the one place temperature, top-k and top-p are applied, to the target's
logits and a draft's alike.
"""

from __future__ import annotations

import hashlib
import struct

import torch

from servelab.engine.request import Request, SamplingParams

TARGET_STREAM = 0
DRAFT_STREAM = 1


def sample(logits: torch.Tensor, requests: list[Request]) -> list[int]:
    """One token per row of `logits` [S, vocab] (fp32, on the model's device), for the
    matching request: greedy rows by an argmax on the device, only the token ids copied. A
    vocabulary of one token (a simulated forward's logits) gives that token, whatever the
    sampling."""
    if logits.shape[-1] == 1:
        return [0] * len(requests)
    greedy = logits.argmax(dim=-1).tolist()
    return [
        token if request.sampling.greedy else _sample_one(logits[row], request)
        for row, (token, request) in enumerate(zip(greedy, requests, strict=True))
    ]


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution a sampled token is drawn from: `logits` [vocab] over the temperature,
    cut to the top-k, then to the top-p nucleus (the cut mass is zero, the rest not rescaled:
    `torch.multinomial` normalises). On the host, where the generators are: a row sampled at
    random is the only one copied off the device."""
    scaled = logits.float().cpu() / params.temperature
    if params.top_k > 0:
        kth = torch.topk(scaled, min(params.top_k, scaled.numel())).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        before = sorted_probs.cumsum(0) - sorted_probs
        sorted_probs = sorted_probs.masked_fill(before >= params.top_p, 0.0)
        probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
    return probs


def generator_for(
    params: SamplingParams, index: int, stream: int = TARGET_STREAM
) -> torch.Generator:
    """The (host) generator for a request's output token `index` on `stream`: the same draws
    on every device (`probabilities` brings a sampled row to the host)."""
    generator = torch.Generator()
    generator.manual_seed(draw_seed(params.seed, params.sample_index, index, stream))
    return generator


def draw_seed(seed: int, sample_index: int, index: int, stream: int) -> int:
    """A 32-bit seed that differs, but for chance collisions, whenever any part differs."""
    key = struct.pack("<4q", seed, sample_index, index, stream)
    return int.from_bytes(hashlib.blake2b(key, digest_size=4).digest(), "little")


def draw(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One token from the (unnormalised) distribution `probs` [vocab]."""
    return int(torch.multinomial(probs, 1, generator=generator).item())


def _sample_one(logits: torch.Tensor, request: Request) -> int:
    probs = probabilities(logits, request.sampling)
    return draw(probs, generator_for(request.sampling, len(request.output_ids)))
