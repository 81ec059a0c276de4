"""Paged KV in the real engine on the tiny model: exact greedy tokens under every paged feature.

Every run checks the manager's integrity after every step, and every output against the
cache-free greedy reference (fp32): prefix caching, preemption by recompute and by swap,
chunked prefill, block sizes 4 and 16, lengths that are not multiples of the block size.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from servelab.engine.engine import Engine
from servelab.engine.request import Request, SamplingParams
from servelab.models.model import LlamaModel
from servelab.strategies.settings import StrategySettings
from tests import tiny


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """Tiny matrices gain nothing from threads, and on a shared loaded machine threads that
    wait on each other make each op orders of magnitude slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def model() -> LlamaModel:
    return tiny.tiny_model()


def _check(engine: Engine) -> None:
    engine.kv.check_integrity()


def _serve_exact(
    model: LlamaModel,
    prompts: list[list[int]],
    counts: list[int],
    settings: StrategySettings,
    **limits: int,
) -> tuple[Engine, list[Request], list[dict]]:
    """`prompts` served under `settings`, the KV checked after every step, each output the
    greedy reference's."""
    requests = tiny.make_requests(prompts, counts)
    engine = tiny.make_engine(model, settings, **limits)
    records = tiny.serve(engine, requests, check=_check)
    for request, prompt, count in zip(requests, prompts, counts, strict=True):
        assert request.output_ids == tiny.greedy_reference(model, prompt, count), request.id
        assert request.finish_reason == "length"
    return engine, requests, records


@pytest.mark.parametrize("block_size", [4, 16])
def test_paged_outputs_match_the_reference(model: LlamaModel, block_size: int) -> None:
    prompts = tiny.random_prompts(5, 3, 21, seed=1)
    counts = [5, 9, 3, 12, 1]
    settings = tiny.strategy("iteration", "paged", block_size=block_size)
    engine, _, records = _serve_exact(
        model, prompts, counts, settings, kv_slots=256, max_num_seqs=3
    )
    assert all(r["kv_allocated_slots"] % block_size == 0 for r in records)
    final = engine.kv.stats()
    assert (final.allocated_slots, final.live_slots) == (0, 0)
    assert final.extra["kv_blocks_free"] == 256 // block_size
    assert sum(r["preempted"] for r in records) == 0


def test_shared_prefix_hits_the_cache_and_keeps_outputs_exact(model: LlamaModel) -> None:
    prefix = tiny.random_prompts(1, 40, 40, seed=2)[0]
    tails = tiny.random_prompts(5, 3, 7, seed=3)
    prompts = [prefix + tail for tail in tails]
    counts = [6, 4, 7, 5, 6]
    settings = tiny.strategy("iteration", "paged", prefix_caching=True)
    _, requests, records = _serve_exact(
        model, prompts, counts, settings, kv_slots=256, max_num_seqs=2
    )
    # the first two start together and miss; each later one finds the 40-token prefix
    assert [r.cached_prompt_tokens for r in requests] == [0, 0, 40, 40, 40]
    assert records[-1]["prefix_hit_tokens"] == 120
    assert records[-1]["prefix_query_tokens"] == sum(len(p) for p in prompts)
    assert max(r["kv_shared_blocks"] for r in records) == 10
    assert sum(r["prefill_tokens"] for r in records) == sum(len(p) for p in prompts) - 120


@pytest.mark.parametrize(
    ("preemption", "prefix_caching"),
    [("recompute", False), ("recompute", True), ("swap", False), ("swap", True)],
)
def test_preemption_keeps_outputs_exact(
    model: LlamaModel, preemption: str, prefix_caching: bool
) -> None:
    prompts = tiny.random_prompts(5, 9, 14, seed=4)
    counts = [12, 10, 11, 12, 9]
    settings = tiny.strategy(
        "iteration", "paged", preemption=preemption, prefix_caching=prefix_caching
    )
    _, requests, records = _serve_exact(
        model, prompts, counts, settings, kv_slots=48, max_num_seqs=5
    )
    assert sum(r["preempted"] for r in records) > 0
    assert sum(r.preemptions for r in requests) == sum(r["preempted"] for r in records)
    if preemption == "swap":
        assert max(r["swapped_out_blocks"] for r in records) > 0
        assert records[-1]["swapped_out_blocks"] == 0


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_chunked_prefill_keeps_outputs_exact(model: LlamaModel, prefix_caching: bool) -> None:
    prefix = tiny.random_prompts(1, 13, 13, seed=5)[0]
    prompts = [prefix + tail for tail in tiny.random_prompts(4, 5, 17, seed=6)]
    counts = [4, 7, 5, 6]
    settings = tiny.strategy(
        "iteration", "paged", chunked_prefill=True, prefix_caching=prefix_caching
    )
    *_, records = _serve_exact(
        model, prompts, counts, settings, kv_slots=256, max_num_batched_tokens=8
    )
    assert max(r["prefill_tokens"] + r["decode_tokens"] for r in records) == 8
    assert records[0]["prefill_tokens"] == 8 and records[0]["num_seqs"] == 1


def test_paged_wastes_only_block_tails_where_contiguous_reserves_the_maximum(
    model: LlamaModel,
) -> None:
    prompts = tiny.random_prompts(3, 5, 7, seed=7)
    references = [tiny.greedy_reference(model, p, 3) for p in prompts]
    stops = {ref[2] for ref in references}
    assert not stops & {t for ref in references for t in ref[:2]}, "pick another seed"
    allocated, live = {}, {}
    for kv in ("contiguous", "paged"):
        requests = [
            Request(str(i), list(p), SamplingParams(max_tokens=20)) for i, p in enumerate(prompts)
        ]
        engine = tiny.make_engine(model, tiny.strategy("iteration", kv, block_size=4), kv_slots=200)
        # every request stops after 3 of its 20 tokens
        engine.update.stop_token_ids = frozenset(stops)
        records = tiny.serve(engine, requests)
        assert [r.output_ids for r in requests] == references
        assert [r.finish_reason for r in requests] == ["stop"] * 3
        allocated[kv] = [r["kv_allocated_slots"] for r in records]
        live[kv] = [r["kv_live_slots"] for r in records]
    lengths = [len(p) for p in prompts]
    reserved = sum(lengths) + 3 * 20
    # stats are taken after each step's compute, before the finished requests are freed
    assert allocated["contiguous"] == [reserved] * 3
    assert live["contiguous"] == live["paged"] == [sum(lengths) + k for k in (0, 3, 6)]
    blocks = [sum(-(-(n + k) // 4) for n in lengths) for k in (0, 1, 2)]
    assert allocated["paged"] == [4 * b for b in blocks]
    waste = {kv: (allocated[kv][2] - live[kv][2]) / allocated[kv][2] for kv in allocated}
    assert waste["paged"] < 0.25 < 0.6 < waste["contiguous"]
