"""A test-only knob that slows one run down on purpose: a fixed sleep before every engine step.

It exists so that tests can prove a performance gate fails when a strategy gets slower. It
cannot be set by accident: the key is absent from `conf/config.yaml`, so Hydra accepts it
only as an explicit addition (`+engine.test_step_delay_s=0.2`). A run that uses it says so:
its summary records the delay and carries a flag that its figures are not real.
"""

from __future__ import annotations

import time

from omegaconf import DictConfig

from servelab.base.errors import ConfigError
from servelab.engine.step_update import StepResult

KEY = "test_step_delay_s"


def step_delay_s(engine_node: DictConfig) -> float:
    """The configured delay in seconds (0 when the key is absent)."""
    value = engine_node.get(KEY, 0.0)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 60:
        raise ConfigError(f"engine.{KEY}", f"{value!r} must be seconds in [0, 60] (test-only)")
    return float(value)


def delay_flag(delay_s: float) -> str:
    return f"engine.{KEY}={delay_s:g}: every step delayed on purpose (test-only); not real figures"


class StepDelay:
    """A step hook that sleeps `delay_s` before every engine step."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    def step_started(self, step: int) -> None:
        del step
        time.sleep(self.delay_s)

    def step_finished(self, result: StepResult) -> None:
        del result
