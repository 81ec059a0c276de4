"""One scheduling decision per engine step, with 64 and 256 requests decoding.

Each round is what the engine asks of its scheduler every step: `schedule()` (which grows
every running request's KV by one token, and for paged KV with prefix caching registers the
blocks that filled), followed by the bookkeeping a decode step does to each scheduled
request (its new token computed, one output token appended). No model runs. Prompts are
distinct per request, so prefix caching finds nothing to share; the KV cache has room for
every request's maximum, so nothing is preempted and each round does the same work.
"""

from __future__ import annotations

import pytest
import torch

from servelab.engine.kv_cache import KVLayout, allocate_kv_cache
from servelab.engine.request import Request, SamplingParams
from servelab.engine.scheduling import Scheduler, SchedulerLimits, SchedulerOutput
from tests.tiny import strategy

PROMPT = 64
MAX_TOKENS = 1024  # more than any benchmark's rounds, so that no request finishes
ROUNDS = 200
# The scheduler only counts slots; one tiny layer keeps the cache small.
LAYOUT = KVLayout(num_layers=1, stored_kv_heads=1, head_dim=1, dtype=torch.float32)
STRATEGIES = {
    "fastertransformer": dict(
        batching="static",
        kv="contiguous",
        return_at="batch_end",
        pad_finished=True,
        pad_prompts=True,
    ),
    "orca": dict(batching="iteration", kv="contiguous"),
    "vllm": dict(batching="iteration", kv="paged", block_size=16, prefix_caching=True),
}


def advance(out: SchedulerOutput) -> None:
    """What a step does to each scheduled request: compute its tokens, append one output."""
    for seq in out.seqs:
        seq.request.num_computed_tokens += seq.num_new_tokens
        seq.request.output_ids.append(7)


def decoding_scheduler(name: str, running: int) -> Scheduler:
    """A scheduler with `running` requests admitted and prefilled, each about to decode."""
    settings = strategy(**STRATEGIES[name])
    slots = running * (PROMPT + MAX_TOKENS) + 64
    cache = allocate_kv_cache(
        LAYOUT, slots * LAYOUT.bytes_per_token, settings.kv_block_size, torch.device("cpu")
    )
    kv = settings.kv.build(cache)
    limits = SchedulerLimits(max_num_seqs=running, max_num_batched_tokens=running * PROMPT)
    scheduler = settings.batching.build(kv, limits, settings.policy.build())
    for index in range(running):
        prompt = list(range(index * PROMPT, (index + 1) * PROMPT))
        scheduler.add(
            Request(str(index), prompt, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
        )
    prefill = scheduler.schedule()
    assert len(prefill.seqs) == running
    advance(prefill)
    return scheduler


@pytest.mark.parametrize("running", [64, 256])
@pytest.mark.parametrize("name", list(STRATEGIES))
def test_scheduler_step(benchmark, name: str, running: int) -> None:
    scheduler = decoding_scheduler(name, running)
    benchmark.group = f"scheduler step, {running} decoding"

    def step() -> int:
        out = scheduler.schedule()
        advance(out)
        return len(out.seqs)

    scheduled = benchmark.pedantic(step, rounds=ROUNDS, warmup_rounds=5)
    assert scheduled == running
