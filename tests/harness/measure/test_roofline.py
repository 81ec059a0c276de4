"""Roofline counts against hand-computed FLOPs and bytes for a tiny shape, and MFU/MBU."""

from __future__ import annotations

import pytest

from servelab.engine.model_runner import attended_pairs
from servelab.harness.measure.calibrate import Peaks
from servelab.harness.measure.roofline import ModelShape, StepCost, step_cost, utilisation

# 2 layers, hidden 8, 2 query heads and 1 KV head of size 4, intermediate 16, vocab 32.
TINY = ModelShape(
    num_layers=2,
    hidden_size=8,
    num_heads=2,
    num_kv_heads=1,
    head_dim=4,
    intermediate_size=16,
    vocab_size=32,
    tie_embeddings=True,
)
# Per token and layer, linear FLOPs / 2: q 8*8 + k,v 2*8*4 + o 8*8 + gate,up,down 3*8*16 = 576.
# KV bytes per token (K and V, 2 layers, 1 head of 4, 2 bytes each): 2*2*1*4*2 = 32.
# Activation elements per token and layer: 4*8 (H) + 4*8 (q*d) + 2*16 (I) = 96.


def test_attended_pairs_are_causal() -> None:
    assert attended_pairs(3, 3) == 6  # prefill: 1 + 2 + 3
    assert attended_pairs(1, 5) == 5  # decode: the whole context
    assert attended_pairs(2, 5) == 9  # a chunk after 3 cached tokens: 4 + 5
    assert attended_pairs(0, 4) == 0


def test_prefill_step() -> None:
    cost = step_cost(TINY, 1000.0, [3], [3], 1, 2.0, 4.0)
    # FLOPs: 2 layers * (2*3*576 + 2*2*(2*4)*6 pairs) + LM head 2*1*8*32
    #      = 2 * (3456 + 192) + 512 = 7808
    # bytes: weights 1000 + KV 32 * (3 read + 3 written)
    #      + activations 4 * (3*8 embedding + 2*3*96 layers + 1*(8 + 32) LM head)
    #      = 1000 + 192 + 2560
    assert cost == StepCost(flops=7808.0, bytes=3752.0)


def test_decode_step_of_two_sequences() -> None:
    cost = step_cost(TINY, 1000.0, [1, 1], [5, 3], 2, 2.0, 4.0)
    # FLOPs: 2 * (2*2*576 + 4*8*(5 + 3)) + 2*2*8*32 = 2 * (2304 + 256) + 1024 = 6144
    # bytes: 1000 + 32 * (8 read + 2 written) + 4 * (2*8 + 2*2*96 + 2*40) = 1000 + 320 + 1920
    assert cost == StepCost(flops=6144.0, bytes=3240.0)


def test_chunked_prefill_mixed_with_decode_and_fewer_logits() -> None:
    cost = step_cost(TINY, 0.0, [2, 1], [5, 4], 1, 1.0, 2.0)
    # FLOPs: 2 * (2*3*576 + 32*(9 + 4)) + 2*1*8*32 = 2 * (3456 + 416) + 512 = 8256
    # bytes: KV 16 * (9 read + 3 written) + 2 * (3*8 + 2*3*96 + 40) = 192 + 2 * 640
    assert cost == StepCost(flops=8256.0, bytes=1472.0)


def test_stored_kv_heads_change_kv_bytes_only() -> None:
    gqa = step_cost(TINY, 1000.0, [1, 1], [5, 3], 2, 2.0, 4.0)
    mha = step_cost(TINY, 1000.0, [1, 1], [5, 3], 2, 2.0, 4.0, stored_kv_heads=2)
    assert mha.flops == gqa.flops
    assert mha.bytes - gqa.bytes == 320.0  # the KV traffic doubles: 2 heads instead of 1


@pytest.mark.parametrize(
    ("query_lens", "seq_lens", "num_logits", "message"),
    [
        ([1, 1], [3], 1, "query_lens has 2 entries but seq_lens has 1"),
        ([4], [3], 1, "sequence 0: need 0 <= query_len <= seq_len, got 4 and 3"),
        ([1], [3], 2, "num_logits must be between 0 and the 1 new tokens, got 2"),
    ],
)
def test_step_cost_rejects_inconsistent_batches(
    query_lens: list[int], seq_lens: list[int], num_logits: int, message: str
) -> None:
    with pytest.raises(ValueError, match=f"^{message}$"):
        step_cost(TINY, 0.0, query_lens, seq_lens, num_logits, 2.0, 2.0)


def test_utilisation_divides_achieved_rates_by_the_peaks() -> None:
    peaks = Peaks(
        matmul_flops_per_s=1e10, copy_bytes_per_s=5e9, device="cpu", dtype="float32", host="h"
    )
    mfu, mbu = utilisation(StepCost(flops=1e9, bytes=2e9), 0.5, peaks)
    assert mfu == pytest.approx(0.2, rel=1e-12)
    assert mbu == pytest.approx(0.8, rel=1e-12)
    with pytest.raises(ValueError, match="seconds must be positive"):
        utilisation(StepCost(flops=1.0, bytes=1.0), 0.0, peaks)
