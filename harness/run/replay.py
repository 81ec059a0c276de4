"""Replay a workload against an engine in real time, open loop or closed loop.

A client thread hands each request to the server's inbox when it arrives: open loop, at the
workload's scheduled time whatever the engine is doing; closed loop, when the same user's
previous response was delivered, plus the think time. `t_scheduled` is that arrival, and
every latency starts there: a request that arrives while the engine is inside a step waits
in the inbox, and that wait is the server's queueing. `t_send` is when the client actually
put it there; `send_lag` = t_send − t_scheduled measures only the client's own lateness.
The engine loop drains the inbox before every step, so one step is the longest a request
can wait unnoticed. Every step record and every delivered response goes to the run writer as
it happens; if the run fails, each request in flight is written with `finish_reason: error`,
and if it stops early (`slo.stop_early`), each not yet delivered with `stopped`.
"""

from __future__ import annotations

import heapq
import queue
import sys
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol

from tqdm import tqdm

from servelab.engine.engine import Engine
from servelab.engine.request import Request, SamplingParams
from servelab.engine.step_update import StepResult
from servelab.harness.measure.rundir import RunWriter
from servelab.harness.measure.slo.early_stop import StopRecord
from servelab.harness.run.clock import RunClock
from servelab.harness.run.loop import IDLE_WAIT_S, EngineDriver, StepHook
from servelab.workloads.spec import RequestSpec, Workload


def requests_of(workload: Workload) -> list[Request]:
    """The engine requests of a workload, in its order (the one place they are built)."""
    return [to_request(spec, index) for index, spec in enumerate(workload.requests)]


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
            n=spec.n,
        ),
        t_scheduled=spec.arrival,
        excluded=spec.excluded,
    )


class Inbox(Protocol):
    """Where a client hands requests over: the engine loop's queue, or a peer backend's sender."""

    def put(self, request: Request) -> None: ...


class Arrivals:
    """The requests still to arrive, earliest first: open loop, each at its scheduled time;
    closed loop, `concurrency` users, each user's next request scheduled when that user's
    previous response is delivered, plus the think time. Both replays (real time, and the
    simulation's virtual time) take their arrivals from here."""

    def __init__(self, requests: list[Request], concurrency: int | None, think_s: float):
        self.think_s = think_s
        self.due: list[tuple[float, int, Request]] = []  # (arrival, order, request) heap
        self.later: deque[Request] = deque()  # closed loop: requests no user has taken yet
        self.order = 0
        if concurrency is None:
            for request in requests:
                self.schedule(request, request.t_scheduled)
        else:
            self.later.extend(requests)
            for _ in range(min(concurrency, len(requests))):
                self.schedule(self.later.popleft(), 0.0)

    def schedule(self, request: Request, arrival: float) -> None:
        request.t_scheduled = arrival
        heapq.heappush(self.due, (arrival, self.order, request))
        self.order += 1

    def completed(self, request: Request) -> bool:
        """A response was delivered; True when that user's next request is now scheduled."""
        if not self.later or request.t_done is None:
            return False
        self.schedule(self.later.popleft(), request.t_done + self.think_s)
        return True

    def next_arrival(self) -> float | None:
        return self.due[0][0] if self.due else None

    def arrived(self, now: float) -> list[Request]:
        """Every request whose arrival is at or before `now`, in arrival order."""
        ready = []
        while self.due and self.due[0][0] <= now:
            ready.append(heapq.heappop(self.due)[2])
        return ready


class Client(threading.Thread):
    """Sends requests into `inbox` at their arrival times; stamps `t_send` as it does."""

    def __init__(
        self,
        requests: list[Request],
        clock: Callable[[], float],
        inbox: Inbox,
        concurrency: int | None,
        think_s: float,
    ) -> None:
        super().__init__(name="servelab-client", daemon=True)
        self._clock = clock
        self._inbox = inbox
        self._arrivals = Arrivals(requests, concurrency, think_s)
        self._wake = threading.Condition()
        self._stopped = False

    def completed(self, request: Request) -> None:
        """A response was delivered (closed loop: that user's next request arrives later)."""
        with self._wake:
            if self._arrivals.completed(request):
                self._wake.notify()

    def skip_idle(self, clock: RunClock, inbox_empty: Callable[[], bool]) -> None:
        """The engine has nothing in flight: jump `clock` to the next arrival, if one is due
        later, and send it now. Under the lock that sending holds, so no request can reach
        the inbox between the check that it is empty and the jump."""
        with self._wake:
            upcoming = self._arrivals.next_arrival()
            if upcoming is not None and inbox_empty():
                clock.skip_to(upcoming)
                self._wake.notify()

    def stop(self) -> None:
        with self._wake:
            self._stopped = True
            self._wake.notify()

    def run(self) -> None:
        with self._wake:
            while not self._stopped:
                upcoming = self._arrivals.next_arrival()
                if upcoming is None:
                    self._wake.wait()
                    continue
                wait = upcoming - self._clock()
                if wait > 0:
                    self._wake.wait(wait)
                    continue
                for request in self._arrivals.arrived(self._clock()):
                    request.t_send = self._clock()
                    self._inbox.put(request)


def serve_all(
    engine: Engine, requests: list[Request], on_step: Callable[[Engine], None] | None = None
) -> list[StepResult]:
    """Offline, no clock: add every request, step until all are delivered; the step results.

    `on_step(engine)` runs after every step (integrity checks in tests)."""
    driver = EngineDriver(engine)
    for request in requests:
        request.t_send = request.t_scheduled
        driver.admit(request)
    results = []
    while engine.has_unfinished():
        results.append(driver.step())
        if on_step is not None:
            on_step(engine)
    return results


def progress_bar(total: int, enabled: bool) -> tqdm:
    """A live bar on a terminal; in a log, a line every 30 s rather than a flood."""
    terminal = sys.stderr.isatty()
    return tqdm(
        total=total,
        desc="requests",
        unit="req",
        disable=not enabled,
        mininterval=0.1 if terminal else 30.0,
        dynamic_ncols=terminal,
    )


class Tally:
    """How many of a run's requests are recorded, with the progress bar: `closed` counts one
    and tells `completed` (a closed-loop client schedules that user's next request)."""

    def __init__(self, total: int, progress: bool, completed: Callable[[Request], object]):
        self.total = total
        self.recorded = 0
        self.completed = completed
        self.bar = progress_bar(total, progress)

    def closed(self, request: Request) -> None:
        self.completed(request)
        self.recorded += 1
        self.bar.update(1)

    @property
    def all_recorded(self) -> bool:
        return self.recorded >= self.total


def replay(
    engine: Engine,
    requests: list[Request],
    workload: Workload,
    clock: Callable[[], float],
    writer: RunWriter,
    hooks: Sequence[StepHook] = (),
    progress: bool = True,
    stop: Callable[[float], StopRecord | None] = lambda now: None,
    skip_idle: RunClock | None = None,
) -> None:
    """Serve `requests` (the workload's, from `requests_of`) as the workload sends them.
    `stop` is asked after every step whether the run can end early (`early_stop`); if so,
    every request not yet delivered is recorded as `stopped` and `StoppedEarly` raised.
    With `skip_idle` (the run's clock), a wait with nothing in flight is skipped on it
    (`harness.run.clock`)."""
    inbox: queue.SimpleQueue[Request] = queue.SimpleQueue()
    client = Client(requests, clock, inbox, workload.concurrency, workload.think_s)
    driver = EngineDriver(engine, writer, hooks)
    tally = Tally(len(requests), progress, client.completed)

    def receive(request: Request) -> None:
        if not driver.admit(request):
            tally.closed(request)  # rejected: it can never be served here

    client.start()
    try:
        with driver.serving():
            while not tally.all_recorded:
                if not engine.has_unfinished():
                    if skip_idle is not None:
                        client.skip_idle(skip_idle, inbox.empty)
                    try:
                        receive(inbox.get(timeout=IDLE_WAIT_S))
                    except queue.Empty:
                        continue
                while not inbox.empty():
                    receive(inbox.get_nowait())
                if not engine.has_unfinished():
                    continue
                for request in driver.step().delivered:
                    tally.closed(request)
                driver.stop_if(stop, requests)
    finally:
        client.stop()
        tally.bar.close()
