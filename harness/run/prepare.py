"""servelab's engine made ready for a run before its clock starts: the engine built under the
strategy, the workload built and checked against it, the engine warmed up.

`backend=inprocess` replays on it (`backends.inprocess`); `offline` serves a workload on it to
completion.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from servelab.base.errors import ConfigError
from servelab.engine.engine import Engine
from servelab.engine.request import Request
from servelab.harness.run.build import ServedModel
from servelab.harness.run.replay import requests_of
from servelab.harness.run.spec import RunSpec
from servelab.harness.run.startup import Started, start_engine
from servelab.harness.run.warmup import Warmup, warm_up, warmup_shapes
from servelab.workloads.build import build_workload
from servelab.workloads.spec import Workload


@dataclass
class Prepared:
    """Everything a run needs, validated and built, before the clock starts."""

    started: Started
    workload: Workload
    requests: list[Request]  # the workload's, as the engine serves them
    warmup: Warmup | None  # None: engine.warmup=false

    @property
    def engine(self) -> Engine:
        return self.started.engine

    @property
    def served(self) -> ServedModel:
        return self.started.served


def prepare(spec: RunSpec, clock: Callable[[], float], progress: bool = True) -> Prepared:
    started = start_engine(spec.engine_or_fail(), clock, progress)
    workload = build_workload(
        spec.workload, started.tokenizer, started.served.loaded.config.max_context
    )
    requests = requests_of(workload)
    check_workload(requests, started.engine)
    warmup = None
    if started.settings.warmup:
        shapes = warmup_shapes(
            min(started.settings.max_batch_size, len(requests)),
            max((len(r.prompt_ids) for r in requests), default=0),
            started.settings.max_num_batched_tokens,
        )
        vocab = started.served.loaded.config.vocab_size
        warmup = warm_up(started.engine, vocab, shapes, progress)
    return Prepared(started, workload, requests, warmup)


def check_workload(requests: list[Request], engine: Engine) -> None:
    """Refuse, before any work, a workload this engine cannot serve at all.

    A prompt the strategy's step budget can never take is a configuration error; a request
    that can never fit the KV cache is rejected when it arrives and recorded, unless no
    request of the workload fits, which leaves nothing to measure."""
    refused = []
    for request in requests:
        rejection = engine.rejection(request)
        if rejection is not None and rejection.limit is not None:
            raise rejection.limit
        if rejection is not None:
            refused.append((request.id, rejection.reason))
    if refused and len(refused) == len(requests):
        rid, reason = refused[0]
        raise ConfigError(
            "engine.kv_budget",
            f"no request can be served: request {rid} {reason}; raise engine.kv_budget or "
            "shorten the requests",
        )
