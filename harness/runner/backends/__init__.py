"""What serves a run's workload (`backend`): servelab's engine, or a peer measured the same way.

`inprocess` is servelab's engine under `strategy` (built in `harness.runner.run`). The peers
live here, each with the same arrivals (the replay's `Client`), the same `RequestRecord`s and
so the same summary and reports: `openai` drives any OpenAI-compatible server over HTTP,
`hf_static` runs transformers' `generate` on padded batches and `hf_continuous` transformers'
own continuous batching, both on the weights servelab loads for `model`. `simulated` is
servelab's engine again with each step's duration predicted by a step-cost model, in virtual
time (`simulated.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from servelab.base.errors import ConfigError
from servelab.harness.runner.backends.base import Backend

if TYPE_CHECKING:
    from servelab.harness.runner.spec import RunSpec

BACKENDS = ("inprocess", "openai", "hf_static", "hf_continuous", "simulated")
ENGINE_LOOPS = ("inprocess", "simulated")  # backends that run the engine's own loop
STOPS_EARLY = (*ENGINE_LOOPS, "openai")  # backends whose runs can stop early (slo.stop_early)
SERVED_HERE = ("inprocess", "hf_static", "hf_continuous")  # a model served in this process


def backend_of(cfg: Mapping[str, Any]) -> str:
    kind = str(cfg.get("backend", "inprocess"))
    if kind not in BACKENDS:
        raise ConfigError("backend", f"{kind!r} is not one of: {', '.join(BACKENDS)}")
    return kind


def peer_backend(spec: RunSpec, progress: bool) -> Backend:
    """A prepared peer backend: everything checked and loaded, nothing sent yet."""
    if spec.backend == "openai":
        from servelab.harness.runner.backends.endpoint import EndpointBackend

        return EndpointBackend.prepare(spec)
    if spec.backend == "simulated":
        from servelab.harness.runner.backends.simulated import SimulatedBackend

        return SimulatedBackend(spec)
    from servelab.harness.runner.backends.hf_backend import HFBackend

    return HFBackend.prepare(spec, continuous=spec.backend == "hf_continuous", progress=progress)
