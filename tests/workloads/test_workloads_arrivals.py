"""Arrival processes: mean rates, gamma burstiness (coefficient of variation), bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest

from servelab.base.errors import ConfigError
from servelab.workloads.arrivals import parse_arrival_spec, sample_arrivals

N = 20_001  # N - 1 gaps
FIELD = "workload.arrival"


def arrivals(node: dict, seed: int = 3) -> np.ndarray:
    return sample_arrivals(parse_arrival_spec(node, FIELD), N, np.random.default_rng(seed))


def assert_gaps(times: np.ndarray, rate: float, cv: float) -> None:
    """Gap mean 1/rate and gap variance (cv/rate)^2, each within 5 standard errors."""
    gaps = np.diff(times)
    n = len(gaps)
    mean, var = 1 / rate, (cv / rate) ** 2
    assert abs(gaps.mean() - mean) < 5 * math.sqrt(var / n)
    fourth = float(np.mean((gaps - gaps.mean()) ** 4))
    se_var = math.sqrt((fourth - gaps.var() ** 2) / n)
    assert abs(gaps.var() - var) < 5 * se_var
    measured_cv = gaps.std() / gaps.mean()
    se_cv = measured_cv * math.sqrt((se_var / (2 * gaps.var())) ** 2 + 1 / n * cv**2)
    assert abs(measured_cv - cv) < 5 * se_cv


def test_offline_sends_everything_at_zero() -> None:
    assert not arrivals({"process": "offline"}).any()


def test_constant_rate_is_exact() -> None:
    times = arrivals({"process": "constant", "rate": 4.0})
    assert times[:4].tolist() == [0.0, 0.25, 0.5, 0.75]
    assert np.allclose(np.diff(times), 0.25)


def test_poisson_rate_and_exponential_gaps() -> None:
    times = arrivals({"process": "poisson", "rate": 2.0})
    assert times[0] == 0.0 and np.all(np.diff(times) >= 0)
    assert_gaps(times, rate=2.0, cv=1.0)


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gamma_rate_and_coefficient_of_variation(burstiness: float) -> None:
    times = arrivals({"process": "gamma", "rate": 5.0, "burstiness": burstiness})
    assert_gaps(times, rate=5.0, cv=1 / math.sqrt(burstiness))


def test_closed_loop_keeps_concurrency_and_schedules_nothing() -> None:
    spec = parse_arrival_spec({"process": "closed_loop", "concurrency": 4}, FIELD)
    assert spec.concurrency == 4
    assert not sample_arrivals(spec, 10, np.random.default_rng(0)).any()


def test_same_seed_same_times() -> None:
    node = {"process": "gamma", "rate": 1.0, "burstiness": 0.5}
    assert arrivals(node, 1).tolist() == arrivals(node, 1).tolist()
    assert arrivals(node, 1).tolist() != arrivals(node, 2).tolist()


@pytest.mark.parametrize(
    ("node", "field"),
    [
        ({"process": "poisson", "rate": 0}, "rate"),
        ({"process": "poisson", "rate": -2.0}, "rate"),
        ({"process": "poisson"}, "rate"),
        ({"process": "constant", "rate": float("inf")}, "rate"),
        ({"process": "gamma", "rate": 1.0, "burstiness": 0}, "burstiness"),
        ({"process": "closed_loop"}, "concurrency"),
        ({"process": "closed_loop", "concurrency": 0}, "concurrency"),
        ({"process": "bursty"}, "process"),
        ({"process": "poisson", "rte": 2}, "rte"),
    ],
)
def test_bad_arrivals_name_the_field(node: dict, field: str) -> None:
    with pytest.raises(ConfigError) as error:
        parse_arrival_spec(node, FIELD)
    assert error.value.field == f"{FIELD}.{field}"
