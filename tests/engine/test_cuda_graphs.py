"""Decode steps replayed per batch-size bucket (`engine/cuda_graphs.py`): the buckets,
the padded static path serving the eager engine's tokens (its portable twin runs the padded
forwards eagerly, the Triton kernels interpreted on a CPU; on CUDA the captured graphs), and
padded rows writing no KV, and a bucket's forward asking nothing of the host (what a capture
cannot hold)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from benchmarks.bench_launches import decode_engine
from servelab.base.batch import ForwardBatch
from servelab.engine.cuda_graphs import DecodeGraphs, buckets_for
from servelab.engine.kv_cache import KVLayout
from servelab.harness.checks.launches import count_launches
from servelab.harness.run.build import build_engine
from servelab.kernels.layer_triton import rotary_write_kv
from servelab.models.dummy import DUMMY_SHAPES
from tests import tiny

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
MAX_ROWS = 4  # sequences a step: decode batches of 1..4 rows, 3 padded up to the bucket of 4


def test_buckets_are_vllms_sizes_up_to_the_largest_batch() -> None:
    assert buckets_for(1) == (1,)
    assert buckets_for(3) == (1, 2, 4)
    assert buckets_for(5) == (1, 2, 4, 8)
    assert buckets_for(32) == (1, 2, 4, 8, 16, 24, 32)
    assert buckets_for(33)[-2:] == (32, 40)


def served(kv: str, graphs: bool | None) -> tuple[list[list[int]], list[torch.Tensor], int]:
    """Tokens, the KV cache afterwards, and the decode steps the graphs served (every
    decode-only step is asserted served); `graphs` None: eager only; False: the padded
    forwards run eagerly; True: captured (CUDA)."""
    model = tiny.tiny_model(seed=3).to(DEVICE)
    config = model.config
    layout = KVLayout(config.num_layers, model.kv_heads_stored, config.head_dim, torch.float32)
    settings = replace(
        tiny.engine_settings(400 * layout.bytes_per_token, MAX_ROWS, 64, attention="triton"),
        device=DEVICE, cuda_graphs=False,
    )  # fmt: skip
    engine = build_engine(model, settings, tiny.strategy("iteration", kv), lambda: 0.0)
    runner, replays = engine.runner, []
    if graphs is not None:
        decode = DecodeGraphs(
            model, runner.cache, runner.attention, kv == "paged", config.max_context, DEVICE
        )
        assert decode.capture(buckets_for(MAX_ROWS), graphs).enabled
        runner.graphs = decode
        run = decode.run

        def counted(batch: ForwardBatch) -> torch.Tensor | None:
            logits = run(batch)
            assert (logits is not None) == batch.is_decode_only
            replays.append(logits is not None)
            return logits

        decode.run = counted  # type: ignore[method-assign]
    requests = tiny.make_requests(tiny.random_prompts(6, 3, 30, seed=5), [12, 5, 9, 16, 7, 11])
    tiny.serve(engine, requests)
    assert all(r.output_ids for r in requests)
    return [r.output_ids for r in requests], runner.cache.k + runner.cache.v, sum(replays)


@pytest.mark.parametrize("kv", ["paged", "contiguous"])
def test_the_padded_static_decode_serves_the_eager_tokens(kv: str) -> None:
    eager, eager_cache, _ = served(kv, None)
    padded, padded_cache, steps = served(kv, False)
    assert padded == eager and steps >= 10
    for a, b in zip(padded_cache, eager_cache, strict=True):  # padded rows wrote nothing
        torch.testing.assert_close(a, b)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("kv", ["paged", "contiguous"])
def test_captured_graphs_serve_the_eager_tokens(kv: str) -> None:
    eager, _, _ = served(kv, None)
    replayed, _, steps = served(kv, True)
    assert replayed == eager and steps > 0


@pytest.mark.parametrize("name", ["vllm", "vllm-awq", "orca"])
def test_a_bucket_forward_neither_reads_back_nor_copies_from_the_host(name: str) -> None:
    """A graph replays its kernels on whatever its buffers hold: a device value read back
    while it is captured, or host data copied in, would be frozen into every replay. So the
    forward a bucket captures reads its step from the static buffers only: no sync, no
    transfer (the host's lengths, planned with, are the host's), on the paged and the
    contiguous cache, dense and int4."""
    engine = decode_engine(DUMMY_SHAPES["tiny"], MAX_ROWS, torch.float16, DEVICE, "triton", name)
    while engine.step() is not None:  # every path warmed, as before a capture
        pass
    runner = engine.runner
    paged = "block_tables" in engine.scheduler.kv.layout([])  # orca: a slab a sequence
    decode = DecodeGraphs(
        runner.model, runner.cache, runner.attention, paged, runner.cache.num_slots, DEVICE
    )
    buckets = buckets_for(MAX_ROWS)
    assert decode.capture(buckets, graphs=False).enabled
    for rows in buckets:
        batch = decode.static_batch(rows)
        with torch.inference_mode(), count_launches(host=batch.host_tensors) as counts:
            runner.model(batch, runner.cache.k, runner.cache.v, runner.attention)
        assert (counts.syncs, counts.transfers) == (0, 0), (rows, counts)
        assert counts.kernels > 0 and counts.host > 0


def test_a_padded_row_writes_no_kv() -> None:
    heads, kv_heads, dim = 4, 2, 16
    qkv = torch.randn(2, (heads + 2 * kv_heads) * dim, device=DEVICE)
    cos, sin = torch.randn(8, dim // 2, device=DEVICE), torch.randn(8, dim // 2, device=DEVICE)
    k_cache = torch.zeros(4, 2, kv_heads, dim, device=DEVICE)
    v_cache = torch.zeros_like(k_cache)
    positions = torch.tensor([3, 0], device=DEVICE)
    slots = torch.tensor([5, -1], device=DEVICE)  # the second row is padding
    rotary_write_kv(qkv, cos, sin, positions, slots, k_cache, v_cache, heads)
    written = (k_cache.view(-1, kv_heads, dim).abs().sum((1, 2)) != 0).nonzero().flatten()
    assert written.tolist() == [5]
    assert torch.equal(
        v_cache.view(-1, kv_heads, dim)[5], qkv[0, (heads + kv_heads) * dim :].view(kv_heads, dim)
    )
    assert v_cache.view(-1, kv_heads, dim)[:5].abs().sum() == 0


def test_off_cuda_the_engine_records_why_no_graphs() -> None:
    model = tiny.tiny_model()
    layout = KVLayout(2, model.kv_heads_stored, model.config.head_dim, torch.float32)
    settings = tiny.engine_settings(100 * layout.bytes_per_token, MAX_ROWS, 24, attention="triton")
    engine = build_engine(
        model, replace(settings, device=torch.device("cpu")), tiny.strategy(), lambda: 0.0
    )
    assert engine.runner.graphs is None and "no CUDA" in engine.runner.graphs_record.reason
