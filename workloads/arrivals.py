"""Arrival processes: when each request is scheduled to be sent, in seconds from the start.

- `offline`: every request at t = 0 (a throughput run).
- `constant`: request i at i / rate.
- `poisson`: exponential gaps with mean 1 / rate; the first request at t = 0.
- `gamma`: gamma gaps with shape b and scale 1 / (rate b), b = `burstiness`: the mean rate
  is `rate` and the gaps' coefficient of variation is 1 / sqrt(b); b = 1 is Poisson,
  b < 1 burstier, b > 1 more regular. The first request at t = 0.
- `closed_loop`: `concurrency` users, each sending its next request `think_s` seconds after
  its last one completed; scheduled times are all 0 and the replay paces them (a request
  arrives when its user's previous response was delivered, plus the think time).
- `trace`: the times recorded in the trace or prompt file (see `workloads/traces.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from servelab.base.errors import ConfigError
from servelab.workloads.fields import Node

PROCESSES = ("offline", "constant", "poisson", "gamma", "closed_loop", "trace")
ARRIVAL_KEYS = ("process", "rate", "burstiness", "concurrency", "think_s")
RATED = ("constant", "poisson", "gamma")


@dataclass(frozen=True)
class ArrivalSpec:
    """One arrival process with its parameters checked."""

    process: str
    rate: float | None = None  # requests per second (constant, poisson, gamma)
    burstiness: float = 1.0  # gamma shape b
    concurrency: int | None = None  # closed_loop users
    think_s: float = 0.0  # closed_loop: pause between a user's response and next request


def parse_arrival_spec(value: object, path: str) -> ArrivalSpec:
    """Read and check the `workload.arrival` node."""
    node = Node.of(value, path, ARRIVAL_KEYS)
    process = node.choice("process", PROCESSES)
    if process in RATED:
        burstiness = node.positive("burstiness", default=1.0)
        return ArrivalSpec(process=process, rate=node.positive("rate"), burstiness=burstiness)
    if process == "closed_loop":
        concurrency = node.optional_integer("concurrency", minimum=1)
        if concurrency is None:
            raise ConfigError(node.field("concurrency"), "is required for closed_loop: users >= 1")
        think = node.number("think_s", default=0.0, minimum=0.0)
        return ArrivalSpec(process=process, concurrency=concurrency, think_s=think)
    return ArrivalSpec(process=process)


def sample_arrivals(spec: ArrivalSpec, count: int, rng: np.random.Generator) -> np.ndarray:
    """`count` non-decreasing scheduled times (float64 seconds) for a generated process."""
    if spec.process in ("offline", "closed_loop"):
        return np.zeros(count)
    assert spec.rate is not None
    if spec.process == "constant":
        return np.arange(count, dtype=np.float64) / spec.rate
    if spec.process == "poisson":
        gaps = rng.exponential(1.0 / spec.rate, size=max(count - 1, 0))
    elif spec.process == "gamma":
        shape = spec.burstiness
        gaps = rng.gamma(shape, 1.0 / (spec.rate * shape), size=max(count - 1, 0))
    else:
        raise ValueError(f"arrival process {spec.process!r} takes its times from a file")
    return np.concatenate([np.zeros(min(count, 1)), np.cumsum(gaps)])
