"""Length distributions: sample mean and spread against their parameters, bounds, scaling."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from servelab.base.errors import ConfigError
from servelab.workloads.lengths import parse_length_spec, sample_lengths

N = 20_000
FIELD = "workload.input_len"


def draw(node: dict, scale: float = 1.0, seed: int = 7) -> np.ndarray:
    spec = parse_length_spec(node, FIELD)
    return sample_lengths(spec, N, np.random.default_rng(seed), scale)


def assert_moments(values: np.ndarray, mean: float, var: float) -> None:
    """Mean within 5 standard errors, variance within 5 standard errors of the variance."""
    n = len(values)
    assert abs(values.mean() - mean) < 5 * math.sqrt(var / n)
    centred = values - values.mean()
    fourth = float(np.mean(centred**4))
    se_var = math.sqrt((fourth - values.var() ** 2) / n)
    assert abs(values.var() - var) < 5 * se_var


def test_fixed_is_always_the_value() -> None:
    values = draw({"dist": "fixed", "value": 37})
    assert values.dtype == np.int64
    assert set(values.tolist()) == {37}


def test_uniform_range_covers_both_ends_evenly() -> None:
    values = draw({"dist": "uniform_range", "lo": 10, "hi": 30})
    assert values.min() == 10 and values.max() == 30
    width = 30 - 10 + 1
    assert_moments(values, 20.0, (width**2 - 1) / 12)


def test_uniform_ratio_bounds_follow_the_floor_ceil_convention() -> None:
    spec = parse_length_spec({"dist": "uniform_ratio", "mean": 101, "ratio": 0.25}, FIELD)
    assert (spec.lo, spec.hi) == (math.floor(101 * 0.75), math.ceil(101 * 1.25))
    assert (spec.lo, spec.hi) == (75, 127)
    values = draw({"dist": "uniform_ratio", "mean": 101, "ratio": 0.25})
    assert values.min() == 75 and values.max() == 127
    assert_moments(values, (75 + 127) / 2, ((127 - 75 + 1) ** 2 - 1) / 12)


def test_uniform_ratio_zero_is_fixed() -> None:
    assert set(draw({"dist": "uniform_ratio", "mean": 64, "ratio": 0.0}).tolist()) == {64}


def test_normal_mean_and_std() -> None:
    values = draw({"dist": "normal", "mean": 500, "std": 40, "lo": 1, "hi": 5000})
    assert_moments(values, 500.0, 40.0**2 + 1 / 12)  # rounding adds a uniform error


def test_normal_is_clipped_to_its_range() -> None:
    values = draw({"dist": "normal", "mean": 100, "std": 50, "lo": 80, "hi": 120})
    assert values.min() == 80 and values.max() == 120
    assert (values == 80).sum() > N // 4 and (values == 120).sum() > N // 4


def test_lognormal_mean_and_std_are_those_of_the_lengths() -> None:
    values = draw({"dist": "lognormal", "mean": 161, "std": 150})
    assert_moments(values, 161.0, 150.0**2 + 1 / 12)
    assert np.median(values) < 161  # right-skewed


def test_lognormal_clip() -> None:
    values = draw({"dist": "lognormal", "mean": 338, "std": 300, "lo": 4, "hi": 600})
    assert values.min() >= 4 and values.max() == 600


def test_empirical_draws_from_the_column(tmp_path: Path) -> None:
    path = tmp_path / "lengths.csv"
    path.write_text("other,tokens\nx,10\ny,20\nz,60\n")
    values = draw({"dist": "empirical", "path": str(path), "column": "tokens"})
    assert set(values.tolist()) == {10, 20, 60}
    mean = (10 + 20 + 60) / 3
    var = np.var([10, 20, 60])
    assert_moments(values, mean, float(var))


def test_length_scale_multiplies_lengths() -> None:
    full = draw({"dist": "uniform_range", "lo": 100, "hi": 300})
    quarter = draw({"dist": "uniform_range", "lo": 100, "hi": 300}, scale=0.25)
    assert quarter.tolist() == np.maximum(np.rint(full * 0.25), 1).astype(int).tolist()
    assert set(draw({"dist": "fixed", "value": 3}, scale=0.1).tolist()) == {1}


def test_same_seed_same_lengths_other_seed_other_lengths() -> None:
    node = {"dist": "lognormal", "mean": 50, "std": 30}
    assert draw(node, seed=1).tolist() == draw(node, seed=1).tolist()
    assert draw(node, seed=1).tolist() != draw(node, seed=2).tolist()


@pytest.mark.parametrize(
    ("node", "field"),
    [
        ({"dist": "zipf"}, "dist"),
        ({"dist": "fixed", "value": 0}, "value"),
        ({"dist": "fixed"}, "value"),
        ({"dist": "uniform_range", "lo": 10, "hi": 5}, "lo"),
        ({"dist": "uniform_range", "lo": 10}, "hi"),
        ({"dist": "uniform_ratio", "mean": 10, "ratio": 1.0}, "ratio"),
        ({"dist": "uniform_ratio", "mean": 1, "ratio": 0.5}, "ratio"),
        ({"dist": "normal", "mean": 10, "std": -1}, "std"),
        ({"dist": "lognormal", "mean": 10, "std": -0.5}, "std"),
        ({"dist": "lognormal", "mean": 0, "std": 1}, "mean"),
        ({"dist": "normal", "mean": "ten", "std": 1}, "mean"),
        ({"dist": "normal", "mean": 10, "std": 1, "lo": 0}, "lo"),
        ({"dist": "empirical", "column": "x"}, "path"),
        ({"dist": "fixed", "value": 4, "vlaue": 5}, "vlaue"),
    ],
)
def test_impossible_parameters_name_the_field(node: dict, field: str) -> None:
    with pytest.raises(ConfigError) as error:
        parse_length_spec(node, FIELD)
    assert error.value.field == f"{FIELD}.{field}"


def test_empirical_file_problems(tmp_path: Path) -> None:
    missing = {"dist": "empirical", "path": str(tmp_path / "no.csv"), "column": "n"}
    with pytest.raises(ConfigError, match="does not exist"):
        parse_length_spec(missing, FIELD)
    path = tmp_path / "l.csv"
    path.write_text("n\n5\n0\n")
    with pytest.raises(ConfigError, match="line 3"):
        parse_length_spec({"dist": "empirical", "path": str(path), "column": "n"}, FIELD)
    with pytest.raises(ConfigError) as error:
        parse_length_spec({"dist": "empirical", "path": str(path), "column": "m"}, FIELD)
    assert error.value.field == f"{FIELD}.column"
