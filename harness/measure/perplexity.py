"""Perplexity of a served model on held-out real text: the quality cost of a conversion.

Text comes from the `evaluation` section of the built-in prose (never used for prompts or
calibration). It is tokenised once and cut into windows of `window` tokens; each window is
one prefill through the model (contiguous KV, the same attention path serving uses) with
logits at every position, and the mean next-token negative log-likelihood over all windows
is exponentiated.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from servelab.base.batch import ForwardBatch
from servelab.engine.kv_cache import KVLayout, allocate_kv_cache
from servelab.models.model import AttentionFn, LlamaModel


def perplexity(
    model: LlamaModel,
    token_ids: list[int],
    attention: AttentionFn,
    window: int = 512,
    max_windows: int | None = None,
) -> tuple[float, int]:
    """(perplexity, tokens scored) over consecutive windows of `token_ids`."""
    total_nll, scored = 0.0, 0
    for logits, targets in window_logits(model, token_ids, attention, window, max_windows):
        total_nll += F.cross_entropy(logits, targets, reduction="sum").item()
        scored += int(targets.shape[0])
    return math.exp(total_nll / scored), scored


@torch.inference_mode()
def window_logits(
    model: LlamaModel,
    token_ids: list[int],
    attention: AttentionFn,
    window: int = 512,
    max_windows: int | None = None,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(next-token logits on the CPU, targets) of each consecutive window of `token_ids`."""
    config = model.config
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    layout = KVLayout(config.num_layers, model.kv_heads_stored, config.head_dim, dtype)
    cache = allocate_kv_cache(layout, layout.bytes_per_token * window, 1, device)
    starts = range(0, len(token_ids) - 1, window)
    for index, start in enumerate(starts):
        if max_windows is not None and index >= max_windows:
            break
        chunk = torch.tensor(token_ids[start : start + window + 1])
        if chunk.shape[0] < 2:
            break
        inputs, targets = chunk[:-1], chunk[1:]
        logits = model(
            ForwardBatch.single(inputs, torch.arange(len(inputs))).to(device),
            cache.k,
            cache.v,
            attention,
        )
        yield logits.cpu(), targets
