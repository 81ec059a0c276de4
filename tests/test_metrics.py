"""The metric definitions of DESIGN.md on hand-made records, with exact expected values."""

from __future__ import annotations

import math

import pytest

from harness.measure.metrics import SLO, distribution, request_latencies, summarize


def _request(rid: str, sent: float, times: list[float], prompt: int = 10, **extra) -> dict:
    record = {
        "id": rid,
        "prompt_len": prompt,
        "output_len": len(times),
        "t_scheduled": sent,
        "t_send": sent,
        "token_times": times,
        "output_ids": list(range(len(times))),
        "finish_reason": "length",
        "error": None,
        "preemptions": 0,
        "excluded": False,
    }
    record.update(extra)
    return record


def _step(t0: float, t1: float, allocated: int, live: int, running: int) -> dict:
    waste = (allocated - live) / allocated if allocated else 0.0
    return {
        "t_start": t0,
        "t_end": t1,
        "model_s": (t1 - t0) / 2,
        "kv_waste": waste,
        "running": running,
        "preempted": 0,
    }


def test_request_latencies_follow_the_definitions() -> None:
    lat = request_latencies(_request("a", 1.0, [1.5, 1.7, 2.0, 2.5]))
    assert lat["ttft"] == pytest.approx(0.5)
    assert lat["e2e"] == pytest.approx(1.5)
    assert lat["tpot"] == pytest.approx((1.5 - 0.5) / 3)
    assert lat["normalized_latency"] == pytest.approx(1.5 / 4)


def test_tpot_undefined_for_a_single_token() -> None:
    assert request_latencies(_request("a", 0.0, [0.3]))["tpot"] is None


def test_distribution_uses_linear_percentiles() -> None:
    stats = distribution([1.0, 2.0, 3.0, 4.0])
    assert stats["mean"] == 2.5
    assert stats["p50"] == 2.5
    assert stats["p90"] == pytest.approx(3.7)
    assert stats["p99"] == pytest.approx(3.97)
    assert stats["std"] == pytest.approx(math.sqrt(1.25))
    assert distribution([])["p50"] is None


def test_summary_throughputs_goodput_and_exclusions() -> None:
    requests = [
        _request("a", 0.0, [1.0, 2.0]),
        _request("b", 1.0, [1.5, 1.6, 1.7, 4.0], prompt=20),
        _request("c", 0.5, [9.0], excluded=True),
        _request("d", 0.2, [], finish_reason="error", error="boom"),
    ]
    steps = [_step(0.0, 1.0, 100, 50, 2), _step(1.0, 4.0, 100, 100, 3)]
    summary = summarize(requests, steps, SLO(ttft_s=0.6))
    assert summary["completed"] == 2
    assert summary["failed"] == 1
    assert summary["excluded"] == 1
    assert summary["duration_s"] == pytest.approx(4.0)
    assert summary["request_throughput"] == pytest.approx(0.5)
    assert summary["output_throughput"] == pytest.approx(6 / 4)
    assert summary["total_throughput"] == pytest.approx((6 + 30) / 4)
    assert summary["goodput"] == pytest.approx(1 / 4)  # only b has TTFT <= 0.6
    assert summary["itl"]["mean"] == pytest.approx((1.0 + 0.1 + 0.1 + 2.3) / 4)
    assert summary["kv_waste_mean"] == pytest.approx((0.5 * 1 + 0.0 * 3) / 4)
    assert summary["peak_running"] == 3
    assert summary["normalized_latency"]["mean"] == pytest.approx((2.0 / 2 + 3.0 / 4) / 2)
