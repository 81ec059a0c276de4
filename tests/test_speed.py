"""Each probe judged at the machine's speed of its own time (`harness/search/speed.py`): the
speed mark, a probe's requests at the reference speed, and a search over a machine that
slows down halfway finding the knee of its start."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from benchmarks.bench_search import COMPARISON, MAKE_RUN, Machine, SyntheticProber
from servelab.harness.measure.speed_mark import SpeedMark, speed_mark_s
from servelab.harness.search.knee import find_knees, widened
from servelab.harness.search.ratio_knee import ProbeRatios
from servelab.harness.search.speed import Speeds


def test_a_speed_mark_is_a_positive_time_and_a_summary_without_one_has_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    threads = torch.get_num_threads()
    seen: list[int] = []
    product = torch.matmul

    def counted(*args: object, **kwargs: object) -> object:
        seen.append(torch.get_num_threads())
        return product(*args, **kwargs)

    monkeypatch.setattr(torch, "matmul", counted)
    assert 0 < speed_mark_s(torch.device("cpu")) < 1
    assert set(seen) == {1} and torch.get_num_threads() == threads  # one thread, then back
    assert SpeedMark.of_summary({}) is None
    assert SpeedMark.of_summary({"speed_mark": {"before_s": 0.002, "after_s": None}}) is None
    mark = SpeedMark.of_summary({"speed_mark": {"before_s": 0.002, "after_s": 0.008}})
    assert mark is not None and mark.seconds == pytest.approx(0.004)


def test_a_probe_run_twice_as_fast_counts_at_half_its_rate_and_twice_its_ratios() -> None:
    ratios = ProbeRatios(1.0, (0.25, 0.5), (False, True))
    judged = ratios.at_speed(2.0)
    assert judged.rate == 0.5 and judged.ratios == (0.5, 1.0) and judged.censored == ratios.censored
    assert ProbeRatios(None, (0.5,), (False,)).at_speed(2.0).rate is None


def test_speeds_take_the_first_mark_as_reference_and_widen_by_the_marks_disagreement() -> None:
    speeds = Speeds()
    ratios = ProbeRatios(1.0, (0.5,), (False,))
    assert speeds.judged(ratios, SpeedMark(0.002, 0.002)) == (ratios, 1.0)
    judged, speed = speeds.judged(ratios, SpeedMark(0.001, 0.001))  # twice as fast
    assert speed == 2.0 and judged.rate == 0.5
    assert speeds.uncertainty == 1.0 and speeds.judged_all  # marks that agree
    speeds.judged(ratios, SpeedMark(0.002, 0.002 * math.exp(0.2)))
    assert speeds.uncertainty == pytest.approx(math.exp(1.96 * math.sqrt(0.04 / 3) / 2))
    assert speeds.judged(ratios, None) == (ratios, 1.0) and not speeds.judged_all


@pytest.mark.parametrize("noise", [None, 0.0])
def test_a_machine_slowing_by_a_third_moves_the_knee_only_where_probes_are_unmarked(
    noise: float | None,
) -> None:
    """vllm alone, the machine 35% slower by the end: judged at their own speed, the probes
    give the knee at the start's speed; unmarked, the same probes read lower (the drift)."""
    vllm = COMPARISON[-1]
    truth = vllm.true_knee(MAKE_RUN.target)
    rng = np.random.default_rng(3)
    machine = Machine(-0.35, 600.0, noise, rng)
    speeds = Speeds(None if noise is None else 0.002)
    knees = find_knees({"vllm": SyntheticProber(vllm, machine, rng)}, MAKE_RUN, 600.0, machine,
                       speeds=speeds)  # fmt: skip
    knee = knees[0]
    assert knee.low is not None and knee.high is not None
    if noise is None:
        assert not speeds.judged_all and knee.high < truth  # read at the slower speed
    else:
        widened(knees, speeds.uncertainty, MAKE_RUN.resolution)
        assert speeds.judged_all and knee.low <= truth <= knee.high
