"""The sampler on one step's logits: 64 rows over the embedded model's 49,152-token vocabulary,
greedy (argmax) and random (temperature, top-k, top-p, a seeded generator per row)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from servelab.engine.request import Request, SamplingParams
from servelab.engine.sampler import sample

VOCAB = 49152
ROWS = 64
PARAMS = {
    "greedy": SamplingParams(max_tokens=16),
    "top-k top-p": SamplingParams(max_tokens=16, temperature=0.8, top_k=50, top_p=0.95),
}


@pytest.mark.parametrize("mode", list(PARAMS))
def test_sample_64_rows(benchmark, mode: str) -> None:
    logits = torch.randn(ROWS, VOCAB, generator=torch.Generator().manual_seed(0))
    requests = [
        Request(str(i), [1, 2, 3], dataclasses.replace(PARAMS[mode], seed=i)) for i in range(ROWS)
    ]
    benchmark.group = "sampler"
    tokens = benchmark(sample, logits, requests)
    assert len(tokens) == ROWS and all(0 <= t < VOCAB for t in tokens)
