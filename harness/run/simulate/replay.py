"""Replay a workload against an engine in virtual time: a discrete-event loop, no threads.

The same events as the real-time replay (`harness.run.replay`), in the same order: a
request arrives at its scheduled time (open loop), or when the same user's previous response
was delivered plus the think time (closed loop); the loop admits every request that has
arrived before each step, and when the engine has nothing to run the clock jumps to the next
arrival. A step's duration is what the simulated runner adds to the clock, plus the cost
model's gap between steps. Every latency starts at arrival, so queueing is counted exactly as
in a real run; `t_send` is the arrival (a simulated client is never late). The records go
to the run writer through the one engine loop body (`EngineDriver`), as in a real run, in
batches of whole lines (`RunWriter.batched`): a rerun reproduces any a crash lost. The
cyclic garbage collector waits until the loop ends (`collector_paused`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from servelab.engine.engine import Engine
from servelab.engine.request import Request
from servelab.harness.measure.rundir import RunWriter
from servelab.harness.measure.slo.early_stop import StopRecord
from servelab.harness.run.collector import collector_paused
from servelab.harness.run.loop import EngineDriver, StepHook
from servelab.harness.run.replay import Arrivals, Tally
from servelab.harness.run.simulate.runner import VirtualClock
from servelab.workloads.spec import Workload


def simulate(
    engine: Engine,
    requests: list[Request],
    workload: Workload,
    clock: VirtualClock,
    gap_s: float,
    writer: RunWriter,
    hooks: Sequence[StepHook] = (),
    progress: bool = True,
    stop: Callable[[float], StopRecord | None] = lambda now: None,
    skipped: list[tuple[float, float]] | None = None,
) -> None:
    """Serve `requests` in virtual time; `stop` as in the real-time replay. Each jump over a
    span with nothing in flight is appended to `skipped`, where given (`replay.skip_idle`:
    the clock jumps either way, and the run says so as a real one that skips would)."""
    arrivals = Arrivals(requests, workload.concurrency, workload.think_s)
    driver = EngineDriver(engine, writer, hooks)
    tally = Tally(len(requests), progress, arrivals.completed)
    try:
        with collector_paused(), writer.batched(), driver.serving():
            while not tally.all_recorded:
                if not engine.has_unfinished():
                    upcoming = arrivals.next_arrival()
                    if upcoming is None:
                        raise RuntimeError("no request left to arrive, but not every one recorded")
                    if skipped is not None and upcoming > clock():
                        skipped.append((clock(), upcoming))
                    clock.advance_to(upcoming)
                for request in arrivals.arrived(clock()):
                    request.t_send = request.t_scheduled
                    if not driver.admit(request):
                        tally.closed(request)  # rejected: it can never be served here
                if not engine.has_unfinished():
                    continue
                for request in driver.step().delivered:
                    tally.closed(request)
                clock.advance(gap_s)
                driver.stop_if(stop, requests)
    finally:
        tally.bar.close()
