"""The engine loop's body, shared by every way the engine serves: in-process runs (`replay`,
`serve_all`), simulated runs, the HTTP server's engine thread, the soak script and the
benchmarks.

`EngineDriver` admits requests (a rejected one is recorded at once), cancels them, and runs
one step at a time: the step hooks around it (profiler windows, roofline annotation, the
test-only delay), the step's record and every delivered response written as it happens.
When serving fails (`serving`), `fail_in_flight` writes each request still in flight as
failed with the error; `stop_if` ends a run early (`slo.stop_early`). Where requests come
from, and what a delivered response wakes, is the caller's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol

from servelab.base.records import RequestRecord, StepRecord
from servelab.engine.engine import Engine
from servelab.engine.request import Request
from servelab.engine.step_update import StepResult
from servelab.harness.measure.slo.early_stop import StoppedEarly, StopRecord

IDLE_WAIT_S = 0.5  # longest a loop blocks on an empty inbox before looking again


class StepHook(Protocol):
    """Called around every engine step (profiler windows, roofline annotation)."""

    def step_started(self, step: int) -> None: ...

    def step_finished(self, result: StepResult) -> None: ...


class RecordSink(Protocol):
    """Where a loop writes what it served (the run directory's `RunWriter`)."""

    def request(self, record: RequestRecord) -> None: ...

    def step(self, record: StepRecord) -> None: ...


class NothingScheduled(RuntimeError):
    """The scheduler holds unfinished requests but scheduled none: a scheduler bug."""

    def __init__(self) -> None:
        super().__init__("the scheduler has unfinished requests but scheduled none")


class EngineDriver:
    def __init__(
        self, engine: Engine, sink: RecordSink | None = None, hooks: Sequence[StepHook] = ()
    ) -> None:
        self.engine = engine
        self.sink = sink
        self.hooks = list(hooks)
        self.in_flight: dict[Request, None] = {}  # admitted, not yet delivered (in order)

    def admit(self, request: Request) -> bool:
        """Hand a request to the engine; False when it can never be served (it is then
        finished as `rejected` and recorded)."""
        if self.engine.add_request(request):
            self.in_flight[request] = None
            return True
        self._record(request)
        return False

    def cancel(self, request: Request) -> bool:
        """Drop an admitted request whose client went away (recorded as `cancelled`); False
        when it was already delivered."""
        if request not in self.in_flight or not self.engine.cancel(request):
            return False
        del self.in_flight[request]
        self._record(request)
        return True

    def step(self) -> StepResult:
        """One engine step, with its hooks; its record and its delivered responses written."""
        for hook in self.hooks:
            hook.step_started(self.engine.step_index)
        result = self.engine.step()
        if result is None:
            raise NothingScheduled
        for hook in self.hooks:
            hook.step_finished(result)
        if self.sink is not None:
            self.sink.step(result.record)
        for request in result.delivered:
            self.in_flight.pop(request, None)
            self._record(request)
        return result

    def stop_if(self, stop: Callable[[float], StopRecord | None], requests: list[Request]) -> None:
        """After a step: if `stop` says the run can end early (`early_stop`), record every
        request of `requests` not yet delivered as `stopped` and raise `StoppedEarly`."""
        stopped = stop(self.engine.clock())
        if stopped is None:
            return
        self.in_flight.clear()
        unserved = [request for request in requests if request.t_done is None]
        fail_in_flight(unserved, stopped.reason(), self.engine.clock, self.sink, "stopped")
        raise StoppedEarly(stopped)

    @contextmanager
    def serving(self) -> Iterator[None]:
        """Around a serving loop: if it fails, every request in flight is recorded as failed
        with the error, and the error goes on (an early stop is not a failure)."""
        try:
            yield
        except StoppedEarly:
            raise
        except BaseException as exc:
            self.fail_in_flight(f"{type(exc).__name__}: {exc}")
            raise

    def fail_in_flight(self, error: str) -> list[Request]:
        """End every admitted request not yet delivered as failed with `error`; them."""
        failed = list(self.in_flight)
        self.in_flight.clear()
        fail_in_flight(failed, error, self.engine.clock, self.sink)
        return failed

    def _record(self, request: Request) -> None:
        if self.sink is not None:
            for record in request.records():
                self.sink.request(record)


def fail_in_flight(
    requests: list[Request],
    error: str,
    clock: Callable[[], float],
    sink: RecordSink | None,
    reason: str = "error",
) -> None:
    """Write every request a run ended without serving, finished as `reason` with `error`
    saying why (a failed run: `error`; a run stopped early: `stopped`)."""
    now = clock()
    for request in requests:
        request.close(reason, now, error)
        if sink is not None:
            for record in request.records():
                sink.request(record)
