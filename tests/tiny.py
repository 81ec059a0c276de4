"""Test helpers: a tiny random Llama, a cache-free greedy reference, and an engine builder.

The tiny model's weights are drawn larger than a trained model's so that its logits are
well separated: exact-token comparisons then test the engine, not fp32 rounding near ties.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from harness.engine.batch import ForwardBatch
from harness.engine.engine import Engine
from harness.engine.kv_cache import KVLayout, allocate_kv_cache
from harness.engine.request import Request, SamplingParams
from harness.models.dummy import DUMMY_SHAPES
from harness.models.load import build_model
from harness.models.model import LlamaModel
from harness.runner.replay import serve_all
from harness.runner.settings import StrategySettings
from kernels.attention import Attention, AttentionConfig
from strategies.assemble import build_kv_manager, build_scheduler, kv_block_size
from strategies.batching.base import SchedulerLimits

CPU = torch.device("cpu")


def tiny_model(seed: int = 0, scale: float = 0.3, dtype: torch.dtype = torch.float32) -> LlamaModel:
    config = DUMMY_SHAPES["tiny"]
    generator = torch.Generator().manual_seed(seed)
    shapes = LlamaModel(config).state_dict()
    state = {
        name: torch.ones_like(t)
        if name.endswith("norm.weight")
        else torch.randn(t.shape, generator=generator) * scale
        for name, t in shapes.items()
    }
    return build_model((config, state), dtype, CPU)


def dense_attention(q, k, v, k_cache, v_cache, batch: ForwardBatch, scale: float):
    group = q.shape[1] // k.shape[1]
    keys = k.repeat_interleave(group, 1).transpose(0, 1)
    values = v.repeat_interleave(group, 1).transpose(0, 1)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), keys, values, is_causal=True, scale=scale
    )
    return out.transpose(0, 1)


@torch.inference_mode()
def greedy_reference(model: LlamaModel, prompt: list[int], max_tokens: int) -> list[int]:
    """Greedy tokens by recomputing the whole sequence each step, no KV cache at all."""
    tokens = list(prompt)
    layers = model.config.num_layers
    for _ in range(max_tokens):
        batch = ForwardBatch.single(torch.tensor(tokens))
        logits = model(batch, [None] * layers, [None] * layers, dense_attention)
        tokens.append(int(logits[0].argmax()))
    return tokens[len(prompt) :]


def strategy(batching: str = "static", kv: str = "contiguous", **overrides) -> StrategySettings:
    fields = dict(
        name=f"{batching}-{kv}",
        batching=batching,
        kv=kv,
        heads="gqa",
        weights="auto",
        decoding="standard",
        chunked_prefill=False,
        block_size=4,
        prefix_caching=False,
        preemption="recompute",
    )
    fields.update(overrides)
    return StrategySettings(**fields)


def make_engine(
    model: LlamaModel,
    settings: StrategySettings,
    kv_slots: int,
    max_num_seqs: int = 8,
    max_num_batched_tokens: int = 256,
    attention: str = "torch",
) -> Engine:
    config = model.config
    layout = KVLayout(config.num_layers, model.kv_heads_stored, config.head_dim, torch.float32)
    block = kv_block_size(settings)
    cache = allocate_kv_cache(layout, kv_slots * layout.bytes_per_token, block, CPU)
    kv = build_kv_manager(settings, cache)
    limits = SchedulerLimits(max_num_seqs, max_num_batched_tokens, settings.chunked_prefill)
    scheduler = build_scheduler(settings, kv, limits)
    clock_state = {"t": 0.0}

    def clock() -> float:
        clock_state["t"] += 0.001
        return clock_state["t"]

    return Engine(
        model,
        cache,
        scheduler,
        Attention(AttentionConfig(attention), CPU),
        CPU,
        clock,
        config.max_context,
    )


def make_requests(prompts: list[list[int]], max_tokens: list[int]) -> list[Request]:
    return [
        Request(
            id=str(i), prompt_ids=list(p), sampling=SamplingParams(max_tokens=m, ignore_eos=True)
        )
        for i, (p, m) in enumerate(zip(prompts, max_tokens, strict=True))
    ]


def serve(engine: Engine, requests: list[Request], check=None) -> list[dict]:
    """Offline: add everything, step until done; `check(engine)` after every step."""
    return serve_all(engine, requests, check)


def random_prompts(count: int, low: int, high: int, seed: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(low, high + 1, (count,), generator=generator).tolist()
    return [torch.randint(17, 49152, (n,), generator=generator).tolist() for n in lengths]
