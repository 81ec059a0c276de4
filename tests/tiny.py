"""Test helpers: a tiny random Llama, a cache-free greedy reference, and an engine builder.

The tiny model's weights are drawn larger than a trained model's so that its logits are
well separated: exact-token comparisons then test the engine, not fp32 rounding near ties.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F

from servelab.base.batch import ForwardBatch
from servelab.engine.engine import Engine
from servelab.engine.kv_cache import KVLayout
from servelab.engine.request import Request, SamplingParams
from servelab.harness.run.build import build_engine
from servelab.harness.run.replay import serve_all
from servelab.harness.run.settings import EngineSettings
from servelab.models.dummy import DUMMY_SHAPES
from servelab.models.load import build_model
from servelab.models.model import LlamaModel
from servelab.strategies.settings import StrategySettings, strategy_settings

CPU = torch.device("cpu")


def tiny_model(
    seed: int = 0, scale: float = 0.3, dtype: torch.dtype = torch.float32, vocab_size: int = 0
) -> LlamaModel:
    """The `tiny` shape with random weights; `vocab_size` shrinks its vocabulary (0: keep)."""
    config = DUMMY_SHAPES["tiny"]
    if vocab_size:
        config = replace(config, vocab_size=vocab_size)
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
    """Strategy settings as a config node would give them; static batching defaults to the
    plain form (own-finish delivery, no padding) unless a test asks for a switch."""
    node = dict(
        name=f"{batching}-{kv}",
        batching=batching,
        kv=kv,
        policy="fcfs",
        heads="gqa",
        weights="dense",
        decoding="standard",
        proposer="ngram",
        chunked_prefill=False,
        block_size=4,
        prefix_caching=False,
        preemption="recompute",
        return_at="own_finish",
        pad_finished=False,
        pad_prompts=False,
    )
    node.update(overrides)
    return strategy_settings(node)


def engine_settings(
    kv_bytes: int, max_num_seqs: int = 8, max_num_batched_tokens: int = 256, attention="torch"
) -> EngineSettings:
    return EngineSettings(
        device=CPU,
        dtype=torch.float32,
        dtype_reason="set",
        kv_budget_bytes=kv_bytes,
        kv_budget_fraction=None,
        max_batch_size=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        attention=attention,
        fused_decode=True,
        cuda_graphs=True,
        seed=0,
        warmup=False,  # engines built here serve no timed run
    )


def make_engine(
    model: LlamaModel,
    settings: StrategySettings,
    kv_slots: int,
    max_num_seqs: int = 8,
    max_num_batched_tokens: int = 256,
    attention: str = "torch",
    draft_model: LlamaModel | None = None,
) -> Engine:
    """An engine over a cache of `kv_slots` of the target's slots (a drafting network's own
    cache takes its share of that budget)."""
    config = model.config
    layout = KVLayout(config.num_layers, model.kv_heads_stored, config.head_dim, torch.float32)
    clock_state = {"t": 0.0}

    def clock() -> float:
        clock_state["t"] += 0.001
        return clock_state["t"]

    engine = engine_settings(
        kv_slots * layout.bytes_per_token, max_num_seqs, max_num_batched_tokens, attention
    )
    return build_engine(model, engine, settings, clock, draft_model)


def make_requests(prompts: list[list[int]], max_tokens: list[int]) -> list[Request]:
    return [
        Request(
            id=str(i), prompt_ids=list(p), sampling=SamplingParams(max_tokens=m, ignore_eos=True)
        )
        for i, (p, m) in enumerate(zip(prompts, max_tokens, strict=True))
    ]


def serve(engine: Engine, requests: list[Request], check=None) -> list[dict]:
    """Offline: add everything, step until done; `check(engine)` after every step. The step
    records, as written to steps.jsonl."""
    return [result.record.to_json() for result in serve_all(engine, requests, check)]


def random_prompts(
    count: int, low: int, high: int, seed: int = 0, vocab_size: int = 49152
) -> list[list[int]]:
    """Prompts of `low..high` random tokens (above the special ids when the vocabulary allows)."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(low, high + 1, (count,), generator=generator).tolist()
    first = 17 if vocab_size > 17 else 0
    return [torch.randint(first, vocab_size, (n,), generator=generator).tolist() for n in lengths]
