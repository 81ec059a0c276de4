"""Token-length distributions for prompts and outputs, parsed from config and sampled.

Every distribution yields integers of at least 1:

- `fixed`: always `value`.
- `uniform_ratio`: integers in [floor(mean (1 - ratio)), ceil(mean (1 + ratio))], both ends
  included (the `--random-range-ratio` convention of `vllm bench serve`).
- `uniform_range`: integers in [lo, hi], both ends included.
- `normal`: N(mean, std), rounded, clipped to [lo, hi].
- `lognormal`: a log-normal whose *lengths* have the given mean and std (not those of the
  log), rounded, clipped to [lo, hi]: sigma^2 = ln(1 + std^2 / mean^2), mu = ln(mean) - sigma^2 / 2.
- `empirical`: drawn with replacement from one column of a CSV file, clipped to [lo, hi].

`lo` defaults to 1 and `hi` to no bound. A `scale` multiplies the drawn lengths afterwards
(rounded, at least 1), so a preset can be shrunk proportionally for a small machine.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from servelab.base.errors import ConfigError
from servelab.workloads.fields import Node

DISTRIBUTIONS = ("fixed", "uniform_ratio", "uniform_range", "normal", "lognormal", "empirical")
LENGTH_KEYS = ("dist", "value", "ratio", "mean", "std", "lo", "hi", "path", "column")


@dataclass(frozen=True)
class LengthSpec:
    """One length distribution with its parameters checked."""

    dist: str
    value: int | None = None  # fixed
    mean: float | None = None  # normal, lognormal (and the centre L of uniform_ratio)
    std: float | None = None  # normal, lognormal
    lo: int = 1  # lower bound (uniform) or clip (normal, lognormal, empirical)
    hi: int | None = None  # upper bound (uniform) or clip; None = unbounded
    values: tuple[int, ...] = ()  # empirical: the lengths read from the CSV column


def parse_length_spec(value: object, path: str) -> LengthSpec:
    """Read and check a length distribution node such as `workload.input_len`."""
    node = Node.of(value, path, LENGTH_KEYS)
    dist = node.choice("dist", DISTRIBUTIONS)
    if dist == "fixed":
        return LengthSpec(dist=dist, value=node.integer("value", minimum=1))
    if dist == "uniform_ratio":
        return _uniform_ratio(node)
    lo = node.integer("lo", default=1, minimum=1)
    hi = node.optional_integer("hi", minimum=1)
    if hi is not None and lo > hi:
        raise ConfigError(node.field("lo"), f"lo {lo} is above hi {hi}; make lo <= hi")
    if dist == "uniform_range":
        if hi is None:
            raise ConfigError(node.field("hi"), "is required for uniform_range: an integer >= lo")
        return LengthSpec(dist=dist, lo=lo, hi=hi)
    if dist == "empirical":
        return LengthSpec(dist=dist, lo=lo, hi=hi, values=_read_column(node))
    mean = node.positive("mean")
    std = node.number("std", minimum=0.0)
    return LengthSpec(dist=dist, mean=mean, std=std, lo=lo, hi=hi)


def _uniform_ratio(node: Node) -> LengthSpec:
    mean = node.positive("mean")
    ratio = node.number("ratio", minimum=0.0)
    if ratio >= 1.0:
        raise ConfigError(node.field("ratio"), f"is {ratio}; it must be in [0, 1)")
    lo = math.floor(mean * (1.0 - ratio))
    hi = math.ceil(mean * (1.0 + ratio))
    if lo < 1:
        raise ConfigError(
            node.field("ratio"),
            f"mean {mean} x (1 - {ratio}) is below 1 token; lower the ratio or raise the mean",
        )
    return LengthSpec(dist="uniform_ratio", mean=mean, lo=lo, hi=hi)


def _read_column(node: Node) -> tuple[int, ...]:
    path_text = node.optional_text("path")
    column = node.optional_text("column")
    if path_text is None:
        raise ConfigError(node.field("path"), "is required for empirical: a CSV file of lengths")
    if column is None:
        raise ConfigError(node.field("column"), "is required for empirical: the column to use")
    path = Path(path_text).expanduser()
    if not path.is_file():
        raise ConfigError(node.field("path"), f"{path} does not exist; give an existing CSV file")
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        if reader.fieldnames is None or column not in reader.fieldnames:
            found = ", ".join(reader.fieldnames or [])
            raise ConfigError(node.field("column"), f"{column!r} is not in {path} ({found})")
        values = [_positive_length(row[column], node, line) for line, row in enumerate(reader, 2)]
    if not values:
        raise ConfigError(node.field("path"), f"{path} has no rows; give a CSV with lengths")
    return tuple(values)


def _positive_length(text: str | None, node: Node, line: int) -> int:
    try:
        number = float(text or "")
    except ValueError:
        number = math.nan
    if not (number >= 1 and number == int(number)):
        raise ConfigError(
            node.field("path"), f"line {line} has {text!r}; lengths must be integers >= 1"
        )
    return int(number)


def sample_lengths(
    spec: LengthSpec, count: int, rng: np.random.Generator, scale: float = 1.0
) -> np.ndarray:
    """`count` lengths (int64, each >= 1) drawn from `spec`, then multiplied by `scale`."""
    raw = _draw(spec, count, rng)
    if scale != 1.0:
        raw = np.rint(raw * scale)
    return np.maximum(raw, 1).astype(np.int64)


def _draw(spec: LengthSpec, count: int, rng: np.random.Generator) -> np.ndarray:
    if spec.dist == "fixed":
        return np.full(count, spec.value, dtype=np.int64)
    if spec.dist in ("uniform_ratio", "uniform_range"):
        assert spec.hi is not None
        return rng.integers(spec.lo, spec.hi + 1, size=count, dtype=np.int64)
    if spec.dist == "normal":
        assert spec.mean is not None and spec.std is not None
        drawn = rng.normal(spec.mean, spec.std, size=count)
    elif spec.dist == "lognormal":
        assert spec.mean is not None and spec.std is not None
        sigma2 = math.log1p((spec.std / spec.mean) ** 2)
        mu = math.log(spec.mean) - sigma2 / 2.0
        drawn = rng.lognormal(mu, math.sqrt(sigma2), size=count)
    else:
        drawn = rng.choice(np.asarray(spec.values, dtype=np.int64), size=count)
    upper = np.inf if spec.hi is None else spec.hi
    return np.clip(np.rint(drawn), spec.lo, upper).astype(np.int64)
