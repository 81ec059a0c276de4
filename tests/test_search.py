"""SLO search: the sustained rule and the bisection, on made-up probes (no model runs)."""

from __future__ import annotations

from harness.commands.search import Probe, bisect_rate, sustained


def test_a_probe_passes_only_when_its_run_says_it_sustained() -> None:
    assert sustained({"status": "complete", "sustained": True})
    assert not sustained({"status": "complete", "sustained": False})
    assert not sustained({"status": "failed", "sustained": True})
    assert not sustained({"status": "complete", "sustained": None})  # no SLO configured


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
