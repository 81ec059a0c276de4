"""Replay a workload against an engine in real time, open loop or closed loop.

Open loop: a request enters the engine when the run's monotonic clock passes its
scheduled arrival, whatever the engine is doing (offline: everything at t=0). Closed loop:
`concurrency` users each send their next request the moment their last one finishes.
`t_scheduled` and `t_send` are both kept, so client-side lag is visible. Every step record
and every finished request goes to the run writer as it happens.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

from tqdm import tqdm

from harness.engine.engine import Engine
from harness.engine.request import Request, SamplingParams
from harness.measure.rundir import RunWriter
from workloads.spec import RequestSpec, Workload


def to_request(spec: RequestSpec, index: int) -> Request:
    return Request(
        id=spec.id,
        prompt_ids=list(spec.prompt_ids),
        sampling=SamplingParams(
            max_tokens=spec.max_tokens,
            temperature=spec.temperature,
            top_k=spec.top_k,
            top_p=spec.top_p,
            ignore_eos=spec.ignore_eos,
            seed=index if spec.seed is None else spec.seed,
        ),
        t_scheduled=spec.arrival,
        excluded=spec.excluded,
    )


class StepHook(Protocol):
    """Called around every engine step (profiler windows, telemetry marks)."""

    def step_started(self, step: int) -> None: ...

    def step_finished(self, step: int) -> None: ...


def serve_all(
    engine: Engine, requests: list[Request], on_step: Callable[[Engine], None] | None = None
) -> list[dict]:
    """Offline, no clock: add every request, step until all finish; the step records.

    `on_step(engine)` runs after every step (integrity checks in tests)."""
    for request in requests:
        request.t_send = 0.0
        engine.add_request(request)
    records = []
    while engine.has_unfinished():
        result = engine.step()
        if result is None:
            raise RuntimeError("the scheduler has unfinished requests but scheduled none")
        records.append(result.record)
        if on_step is not None:
            on_step(engine)
    return records


def replay(
    engine: Engine,
    workload: Workload,
    clock: Callable[[], float],
    writer: RunWriter,
    hooks: list[StepHook] | None = None,
    progress: bool = True,
) -> list[Request]:
    """Serve every request of the workload; returns them, finished, in arrival order."""
    hooks = hooks or []
    requests = [to_request(spec, i) for i, spec in enumerate(workload.requests)]
    pending = deque(requests)
    closed_loop = workload.concurrency is not None
    in_flight = 0
    bar = tqdm(total=len(requests), desc="requests", unit="req", disable=not progress)

    def send(request: Request) -> None:
        nonlocal in_flight
        now = clock()
        if closed_loop:
            request.t_scheduled = now
        request.t_send = now
        engine.add_request(request)
        in_flight += 1

    while pending or engine.has_unfinished():
        now = clock()
        while pending and (
            in_flight < workload.concurrency if closed_loop else pending[0].t_scheduled <= now
        ):
            send(pending.popleft())
        if not engine.has_unfinished():
            time.sleep(max(0.0, pending[0].t_scheduled - clock()))
            continue
        for hook in hooks:
            hook.step_started(engine.step_index)
        result = engine.step()
        if result is None:
            raise RuntimeError("the scheduler has unfinished requests but scheduled none")
        for hook in hooks:
            hook.step_finished(engine.step_index - 1)
        writer.step(result.record)
        for request in result.finished:
            writer.request(request.record())
            in_flight -= 1
        bar.update(len(result.finished))
    bar.close()
    return requests
