"""A workload served offline to completion, every request's greedy output kept: what
`verify` compares strategy by strategy and `quantize` compares weights formats on."""

from __future__ import annotations

import time
from dataclasses import dataclass

from servelab.base.errors import ConfigError
from servelab.engine.step_update import StepResult
from servelab.harness.run.prepare import Prepared, prepare
from servelab.harness.run.replay import serve_all
from servelab.harness.run.spec import RunSpec


@dataclass
class Served:
    outputs: dict[str, list[int]]  # output ids by request id
    prepared: Prepared
    steps: list[StepResult]


def serve_outputs(spec: RunSpec) -> Served:
    """Serve the workload offline as `spec` says, every request at once (greedy only)."""
    start = time.perf_counter()
    prepared = prepare(spec, lambda: time.perf_counter() - start)
    requests = prepared.requests
    if any(not r.sampling.greedy for r in requests):
        raise ConfigError("workload.sampling.temperature", "verify compares greedy outputs; use 0")
    steps = serve_all(prepared.engine, requests)
    return Served({r.id: r.output_ids for r in requests}, prepared, steps)
