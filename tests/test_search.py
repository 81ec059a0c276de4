"""SLO search: the sustained rule and the bisection, on made-up probes (no model runs)."""

from __future__ import annotations

from omegaconf import OmegaConf

from harness.commands.search import Probe, bisect_rate, sustained


def _summary(ttft_p99: float, nl_p50: float, share: float) -> dict:
    return {
        "status": "complete",
        "completed": 10,
        "ttft": {"p99": ttft_p99},
        "tpot": {"p99": 0.01},
        "e2e": {"p99": 1.0},
        "normalized_latency": {"p50": nl_p50},
        "slo_attainment": share,
    }


def test_sustained_needs_every_limit_and_the_share() -> None:
    cfg = OmegaConf.create(
        {
            "slo": {"ttft_s": 1.0, "tpot_s": None, "e2e_s": None, "normalized_latency_s": 0.1},
            "search": {"goodput_share": 0.9},
        }
    )
    assert sustained(_summary(0.5, 0.05, 0.95), cfg)
    assert not sustained(_summary(1.5, 0.05, 0.95), cfg)  # p99 TTFT over its limit
    assert not sustained(_summary(0.5, 0.20, 0.95), cfg)  # p50 normalized latency over
    assert not sustained(_summary(0.5, 0.05, 0.80), cfg)  # too few requests met the SLO


def test_bisection_brackets_the_capacity() -> None:
    probed: list[float] = []

    def probe(rate: float) -> Probe:
        probed.append(rate)
        return Probe(rate, rate <= 3.0, f"run-{rate}", None)

    best, bounded, probes = bisect_rate(probe, 1.0, 8.0, iterations=3)
    assert probed == [1.0, 8.0, 4.5, 2.75, 3.625]
    assert best == 2.75 and bounded and len(probes) == 5
    assert bisect_rate(probe, 4.0, 8.0, 3)[0] is None
    assert bisect_rate(probe, 1.0, 2.0, 3)[:2] == (2.0, False)
