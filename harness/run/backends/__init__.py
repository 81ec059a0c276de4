"""What serves a run's workload (`backend`): servelab's engine, or a peer measured the same way.

Each backend is one module here behind one interface (`base.Backend`), named in `registry`:
`inprocess` is servelab's engine under `strategy`; `simulated` is that engine again with each
step's duration predicted, in virtual time (`harness.run.simulate`); `openai` drives any
OpenAI-compatible server over HTTP (a server the run starts itself: `harness.run.servers`);
`hf_static` runs transformers' `generate` on padded batches and `hf_continuous` transformers' own
continuous batching, both on the weights servelab loads for `model`. All of them replay the same
arrivals and write the same `RequestRecord`s, so the summary and the reports are one.

This module says what each backend is (`KINDS`), without importing any of them: the config is
checked against it, and the summary reads its traits instead of a branch per backend.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from servelab.base.errors import ConfigError


@dataclass(frozen=True)
class BackendKind:
    name: str
    runs_engine: bool  # servelab's own engine loop: the strategy as configured is what served
    stops_early: bool  # its runs can stop once the SLO's verdict is known (slo.stop_early)
    over_http: bool  # a client sent the requests: its lateness and the server's metrics count
    served_here: bool  # the model is served in this process: another busy process is flagged


KINDS = {
    kind.name: kind
    for kind in (
        BackendKind("inprocess", runs_engine=True, stops_early=True, over_http=False,
                    served_here=True),
        BackendKind("openai", runs_engine=False, stops_early=True, over_http=True,
                    served_here=False),
        BackendKind("hf_static", runs_engine=False, stops_early=False, over_http=False,
                    served_here=True),
        BackendKind("hf_continuous", runs_engine=False, stops_early=False, over_http=False,
                    served_here=True),
        BackendKind("simulated", runs_engine=True, stops_early=True, over_http=False,
                    served_here=False),
    )
}  # fmt: skip
BACKENDS = tuple(KINDS)


def backend_of(cfg: Mapping[str, Any]) -> str:
    kind = str(cfg.get("backend", "inprocess"))
    if kind not in BACKENDS:
        raise ConfigError("backend", f"{kind!r} is not one of: {', '.join(BACKENDS)}")
    return kind
