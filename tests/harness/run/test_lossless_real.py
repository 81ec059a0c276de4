"""On the real model in fp32, every lossless strategy serves the tokens of the plain path.

Real-text prompts sharing long system prompts (so prefix caching hits), a KV budget small
enough that the paged strategy must preempt, and a token budget small enough that chunked
prefill splits prompts: `orca`, `orca-chunked`, `vllm` and speculative decoding with every
proposer (prompt lookup over both KV strategies, the target's first layers, the target
drafting for itself through a cache of its own) must each match `fastertransformer` on every
request.
"""

from __future__ import annotations

import pytest
from omegaconf import DictConfig

from servelab.commands.verify import verify
from servelab.harness.run import offline
from servelab.harness.run.compose import compose
from servelab.harness.run.spec import run_spec

pytestmark = pytest.mark.integration


def serve_outputs(cfg: DictConfig) -> offline.Served:
    return offline.serve_outputs(run_spec(cfg))


OVERRIDES = [
    "engine.dtype=fp32",
    "telemetry.roofline=false",
    "workload=shared_prefix",
    "workload.num_requests=8",
    "workload.prompt.groups=2",
    "workload.prompt.prefix_len=48",
    "workload.input_len.lo=8",
    "workload.input_len.hi=24",
    "workload.output_len.value=12",
    "engine.kv_budget=8MiB",  # 182 tokens of fp32 KV: two or three requests at a time
    "strategy.block_size=8",
    "engine.max_num_batched_tokens=80",  # prompts are 56-72 tokens: chunked prefill splits
]


SPECULATIVE = ["orca-spec-ngram", "vllm-spec-ngram", "vllm-spec-layerskip", "vllm-spec-draft"]


def test_lossless_strategies_match_static_batching_exactly() -> None:
    strategies = ["orca", "orca-chunked", "vllm", *SPECULATIVE]
    checks = verify(strategies, [*OVERRIDES, "strategy.gamma=3"], compose, None)
    assert [check.strategy for check in checks] == strategies
    for check in checks:
        assert check.identical == check.requests == 8, (check.strategy, check.divergences)


def test_the_speculative_paged_run_preempted_hit_the_prefix_cache_and_rolled_back() -> None:
    served = serve_outputs(compose([*OVERRIDES, "strategy=vllm-spec-ngram", "strategy.gamma=3"]))
    records = [step.record for step in served.steps]
    assert sum(record.preempted for record in records) > 0
    assert records[-1].counters["prefix_hit_tokens"] > 0
    proposed = sum(record.counters["spec_proposed"] for record in records)
    accepted = sum(record.counters["spec_accepted"] for record in records)
    assert 0 < accepted < proposed


def test_the_paged_run_really_preempted_and_hit_the_prefix_cache() -> None:
    served = serve_outputs(compose([*OVERRIDES, "strategy=vllm"]))
    assert sum(step.record.preempted for step in served.steps) > 0
    assert served.steps[-1].record.counters["prefix_hit_tokens"] > 0


def test_mha_layout_serves_the_tokens_of_native_gqa_with_three_times_the_cache() -> None:
    native = serve_outputs(compose([*OVERRIDES, "strategy=vllm", "engine.kv_budget=64MiB"]))
    repeated = serve_outputs(
        compose([*OVERRIDES, "strategy=vllm", "strategy.heads=mha", "engine.kv_budget=64MiB"])
    )
    assert repeated.outputs == native.outputs
    native_layout = native.prepared.engine.runner.cache.layout
    repeated_layout = repeated.prepared.engine.runner.cache.layout
    assert repeated_layout.bytes_per_token == 3 * native_layout.bytes_per_token


def test_model_drafters_are_lossless_over_contiguous_kv_too() -> None:
    reference = serve_outputs(compose([*OVERRIDES, "strategy=fastertransformer"]))
    for proposer in ("layerskip", "draft"):
        served = serve_outputs(
            compose(
                [*OVERRIDES, "strategy=orca-spec-ngram", f"strategy.proposer={proposer}"]
                + ["strategy.gamma=3"]
            )
        )
        assert served.outputs == reference.outputs, proposer
