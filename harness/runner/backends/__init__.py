"""What serves a run's workload (`backend`): servelab's engine, or a peer measured the same way.

`inprocess` is servelab's engine under `strategy` (built in `harness.runs.run`, which picks the
backend). The peers live here, each with the same arrivals (the replay's `Client`), the same
`RequestRecord`s and so the same summary and reports: `openai` drives any OpenAI-compatible
server over HTTP, `hf_static` runs transformers' `generate` on padded batches and
`hf_continuous` transformers' own continuous batching, both on the weights servelab loads for
`model`. `simulated` is servelab's engine again with each step's duration predicted by a
step-cost model, in virtual time (`harness.simulate.backend`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from servelab.base.errors import ConfigError

BACKENDS = ("inprocess", "openai", "hf_static", "hf_continuous", "simulated")
ENGINE_LOOPS = ("inprocess", "simulated")  # backends that run the engine's own loop
STOPS_EARLY = (*ENGINE_LOOPS, "openai")  # backends whose runs can stop early (slo.stop_early)
SERVED_HERE = ("inprocess", "hf_static", "hf_continuous")  # a model served in this process


def backend_of(cfg: Mapping[str, Any]) -> str:
    kind = str(cfg.get("backend", "inprocess"))
    if kind not in BACKENDS:
        raise ConfigError("backend", f"{kind!r} is not one of: {', '.join(BACKENDS)}")
    return kind
