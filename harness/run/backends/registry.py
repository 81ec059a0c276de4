"""Every backend by its name (`backend=`): how each is prepared before the run's clock starts.
`run.run` looks a run's backend up here; a new backend is one module and one entry."""

from __future__ import annotations

from collections.abc import Callable

from servelab.harness.run.backends import KINDS
from servelab.harness.run.backends.base import Backend
from servelab.harness.run.backends.endpoint import EndpointBackend
from servelab.harness.run.backends.hf import HFBackend
from servelab.harness.run.backends.inprocess import InProcessBackend
from servelab.harness.run.backends.simulated import SimulatedBackend
from servelab.harness.run.clock import RunClock
from servelab.harness.run.spec import RunSpec

Prepare = Callable[[RunSpec, RunClock, bool], Backend]

PREPARE: dict[str, Prepare] = {
    "inprocess": InProcessBackend.prepare,
    "openai": EndpointBackend.prepare,
    "hf_static": HFBackend.prepare,
    "hf_continuous": HFBackend.prepare,
    "simulated": SimulatedBackend.prepare,
}
assert set(PREPARE) == set(KINDS), "every backend named in KINDS is prepared here"


def prepared_backend(spec: RunSpec, clock: RunClock, progress: bool) -> Backend:
    """The run's backend, prepared: every input checked, its model loaded or its endpoint
    reached, nothing sent yet."""
    return PREPARE[spec.backend](spec, clock, progress)
