"""Warm-up and cool-down: requests that are served and recorded but left out of metrics.

Warm-up covers the first `requests` requests, or those scheduled before `seconds`;
cool-down the last `requests`, or those scheduled within `seconds` of the last arrival.
Time windows need a schedule, so offline and closed-loop workloads use request counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from servelab.base.errors import ConfigError
from servelab.workloads.fields import Node

WINDOW_KEYS = ("requests", "seconds")


@dataclass(frozen=True)
class WindowSpec:
    """One excluded window, by count or by time (at most one of the two is set)."""

    requests: int = 0
    seconds: float = 0.0


def parse_window_spec(value: object, path: str) -> WindowSpec:
    """Read and check a `workload.warmup` or `workload.cooldown` node."""
    node = Node.of(value, path, WINDOW_KEYS)
    requests = node.integer("requests", default=0, minimum=0)
    seconds = node.number("seconds", default=0.0, minimum=0.0)
    if requests and seconds:
        raise ConfigError(path, "set requests or seconds, not both")
    return WindowSpec(requests=requests, seconds=seconds)


def mark_excluded(
    arrivals: Sequence[float], warmup: WindowSpec, cooldown: WindowSpec
) -> list[bool]:
    """For arrival-ordered times, whether each request falls in the warm-up or cool-down."""
    count = len(arrivals)
    last = arrivals[-1] if count else 0.0
    marks = []
    for index, arrival in enumerate(arrivals):
        warming = index < warmup.requests or arrival < warmup.seconds
        cooling = index >= count - cooldown.requests or (
            cooldown.seconds > 0 and arrival > last - cooldown.seconds
        )
        marks.append(warming or cooling)
    return marks
