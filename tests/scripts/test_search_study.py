"""The search's own benchmark (`scripts.search_study`): its synthetic strategies have the
knees it says, its machine drifts as it says, and a small run of it reports every knee and
pair."""

from __future__ import annotations

import math

import numpy as np
import pytest

from scripts.search_study import (
    COMPARISON,
    MAKE_RUN,
    Machine,
    Scenario,
    Strategy,
    SyntheticProber,
    covers,
    evaluate,
    main,
)
from servelab.harness.search.probe_ratios import ProbeRatios, probe_quantile
from servelab.harness.search.probes import ProbeSpec


@pytest.mark.parametrize("strategy", COMPARISON, ids=lambda s: s.name)
def test_the_true_knee_is_where_the_quantile_crosses_one(strategy: Strategy) -> None:
    knee = strategy.true_knee(0.9)
    rng = np.random.default_rng(1)
    for rate, side in ((knee * 0.97, -1), (knee * 1.03, 1)):
        ratios = strategy.ratios(rng, 200_000, rate, speed=1.0)
        assert math.copysign(1, np.quantile(ratios, 0.9) - 1) == side, rate


def test_a_faster_machine_moves_every_ratio_down_and_a_probe_over_capacity_rises() -> None:
    vllm = COMPARISON[-1]
    rng = np.random.default_rng(2)
    slow = np.median(vllm.ratios(rng, 20_000, 0.5, speed=1.0))
    fast = np.median(vllm.ratios(rng, 20_000, 0.5, speed=1.2))
    assert fast == pytest.approx(slow / 1.2, rel=0.02)
    over = vllm.ratios(rng, 48, vllm.capacity * 1.5, speed=1.0)
    probe = ProbeRatios(vllm.capacity * 1.5, tuple(over), (False,) * len(over))
    assert probe_quantile(probe, 0.9, 0.95).over_capacity


def test_the_machine_drifts_linearly_and_a_probe_moves_its_clock() -> None:
    machine = Machine(-0.2, span_s=100.0)
    assert machine.speed == 1.0
    prober = SyntheticProber(COMPARISON[-1], machine, np.random.default_rng(3))
    outcome = prober.run(ProbeSpec("rate", 48, rate=2.0))
    assert machine.now == pytest.approx(outcome.seconds) and outcome.seconds > 48 * 0.5 - 1
    machine.now = 50.0
    assert machine.speed == pytest.approx(0.9)
    machine.now = 500.0
    assert machine.speed == pytest.approx(0.8)


def test_an_unbounded_side_holds_everything_beyond() -> None:
    assert covers(None, 2.0, 0.001) and covers(1.0, None, 1e9) and not covers(1.0, 2.0, 2.5)


def test_a_small_run_reports_every_knee_and_pair(capsys: pytest.CaptureFixture[str]) -> None:
    rows = evaluate(COMPARISON, MAKE_RUN, Scenario(), searches=4)
    assert len(rows) == 4 + 6
    assert all(0 <= r.covered <= 1 and 0 <= r.bounded <= 1 for r in rows)
    assert rows[-1].name == "vllm / orca-chunked" and rows[-1].truth > 1
    assert rows[0].separated is None and all(0 <= r.separated <= 1 for r in rows[4:])
    main(["--searches", "2", "--no-prediction"])
    out = capsys.readouterr().out
    assert "2 simulated searches" in out and "no prediction" in out and "vllm / orca" in out


def test_a_synthetic_probe_leaves_its_warm_up_out() -> None:
    prober = SyntheticProber(COMPARISON[-1], Machine(0.0, 100.0), np.random.default_rng(4))
    outcome = prober.run(ProbeSpec("rate", 60, 1.0, warmup=12))
    assert len(outcome.ratios.ratios) == 48 and outcome.served_s == pytest.approx(60 * 1.0)
