"""The warm-up before a run's measured window: its buckets, its record in meta.json, a KV cache
left as it found it, and tokens identical to a run without it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servelab.base.errors import ConfigError
from servelab.engine.shapes import DECODE, PREFILL, Shape
from servelab.harness.measure.rundir import read_requests
from servelab.harness.run.compose import compose
from servelab.harness.run.prepare import prepare
from servelab.harness.run.run import run
from servelab.harness.run.spec import run_spec
from servelab.harness.run.warmup import powers_up_to, warm_up, warmup_shapes

TINY = [
    "model=dummy-tiny", "engine.dtype=fp32", "telemetry.roofline=false", "workload=random",
    "workload.num_requests=6", "workload.output_len.value=8", "workload.arrival.process=offline",
]  # fmt: skip


def test_the_buckets_double_up_to_the_most_the_run_can_use() -> None:
    assert powers_up_to(1, 5) == [1, 2, 4, 5]
    assert powers_up_to(16, 16) == [16]
    assert powers_up_to(16, 0) == []
    assert warmup_shapes(max_rows=5, longest_prompt=100, token_budget=64) == [
        Shape(DECODE, 1, 1, 16), Shape(DECODE, 2, 1, 16), Shape(DECODE, 4, 1, 16),
        Shape(DECODE, 5, 1, 16),
        Shape(PREFILL, 1, 16, 0), Shape(PREFILL, 1, 32, 0), Shape(PREFILL, 1, 64, 0),
    ]  # fmt: skip


@pytest.mark.parametrize("strategy", ["vllm", "fastertransformer"])
def test_a_warm_up_leaves_the_kv_cache_as_it_found_it(strategy: str) -> None:
    prepared = prepare(
        run_spec(compose([*TINY, f"strategy={strategy}"])), clock=lambda: 0.0, progress=False
    )
    warmup = prepared.warmup
    assert warmup is not None and warmup.seconds > 0
    assert [s.rows for s in warmup.shapes if s.kind == DECODE] == [1, 2, 4, 6]
    longest = max(len(r.prompt_ids) for r in prepared.requests)  # 64-192 tokens
    assert [s.new_tokens for s in warmup.shapes if s.kind == PREFILL] == [
        *(n for n in (16, 32, 64, 128) if n < longest),
        longest,
    ]
    kv = prepared.engine.kv
    kv.check_integrity()
    assert kv.stats().allocated_slots == 0


def test_a_run_records_its_warm_up_apart_and_serves_the_same_tokens(tmp_path: Path) -> None:
    warm = run(compose([*TINY, "strategy=orca"]), tmp_path / "warm", progress=False)
    cold = run(
        compose([*TINY, "strategy=orca", "engine.warmup=false"]), tmp_path / "cold", progress=False
    )
    assert warm["status"] == cold["status"] == "complete"
    meta = json.loads((tmp_path / "warm" / "meta.json").read_text())
    assert [s["kind"] for s in meta["warmup"]["shapes"]][:4] == [DECODE] * 4
    assert meta["warmup"]["skipped"] == [] and meta["warmup"]["seconds"] > 0
    assert json.loads((tmp_path / "cold" / "meta.json").read_text())["warmup"] is None
    tokens = [[r.output_ids for r in read_requests(tmp_path / name)] for name in ("warm", "cold")]
    assert tokens[0] == tokens[1]


def test_warmup_must_be_true_or_false() -> None:
    with pytest.raises(ConfigError, match="engine.warmup: 'yes' must be true or false"):
        prepare(run_spec(compose([*TINY, "engine.warmup=yes"])), clock=lambda: 0.0, progress=False)


def test_a_shape_the_kv_cache_cannot_hold_is_skipped_and_nothing_is_held() -> None:
    cfg = compose([*TINY, "strategy=vllm", "engine.warmup=false", "engine.kv_budget=1MiB"])
    prepared = prepare(run_spec(cfg), clock=lambda: 0.0, progress=False)
    vocab = prepared.served.loaded.config.vocab_size
    too_many, one = Shape(DECODE, 4096, 1, 16), Shape(DECODE, 1, 1, 16)
    warmup = warm_up(prepared.engine, vocab, [too_many, one], progress=False)
    assert warmup.skipped == [too_many] and warmup.shapes == [one]
    prepared.engine.kv.check_integrity()
    assert prepared.engine.kv.stats().allocated_slots == 0
