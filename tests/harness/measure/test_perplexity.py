"""Perplexity through the serving attention path equals a cache-free dense computation."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from servelab.base.batch import ForwardBatch
from servelab.harness.measure.perplexity import perplexity
from servelab.kernels.attention import Attention, AttentionConfig
from tests.tiny import CPU, dense_attention, tiny_model


def test_perplexity_matches_dense_cross_entropy_over_windows() -> None:
    model = tiny_model(scale=0.1)
    tokens = torch.randint(17, 49152, (50,), generator=torch.Generator().manual_seed(3)).tolist()
    value, scored = perplexity(model, tokens, Attention(AttentionConfig("torch"), CPU), window=16)
    assert scored == 49
    nll = 0.0
    layers = model.config.num_layers
    for start in range(0, 49, 16):
        chunk = torch.tensor(tokens[start : start + 17])
        inputs = chunk[:-1]
        batch = ForwardBatch.single(inputs, torch.arange(len(inputs)))
        with torch.inference_mode():
            logits = model(batch, [None] * layers, [None] * layers, dense_attention)
        nll += F.cross_entropy(logits, chunk[1:], reduction="sum").item()
    assert math.isclose(value, math.exp(nll / 49), rel_tol=1e-5)
