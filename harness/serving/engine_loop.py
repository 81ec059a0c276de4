"""One engine loop in its own thread, behind the async front end.

The front end never touches the engine: it puts a `Stream` (an engine request plus the
asyncio queue its events go to) into the loop's inbox, or asks for a cancel, and wakes the
loop. Before every step the loop adds what arrived and cancels what was abandoned (freeing
its KV at once); after every step it hands the front end, in one thread-safe call, each
request's new tokens and each delivered response. So the front end never waits for a step,
and the loop never waits for a client: a slow reader only fills its own queue.

At most `max_in_flight` requests are in the loop at once (submitted and not yet closed:
queued, running, or waiting for their last event); `submit` refuses one more, so a flood of
clients queues nowhere unbounded and the front end answers 429 at once.

Admitting, cancelling, stepping and recording go through the same `EngineDriver` as an
in-process run, with the same step hooks (`Started.step_hooks`): with a `RunWriter`, the loop
records what it served exactly as a run does (`steps.jsonl` with the roofline counters, and
a `requests.jsonl` line per delivered, rejected or cancelled request, arrival being when the
server received the request), on its own clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from dataclasses import dataclass, field

from servelab.engine.engine import Engine
from servelab.engine.request import Request
from servelab.harness.run.loop import IDLE_WAIT_S, EngineDriver, fail_in_flight

MAX_IN_FLIGHT = 512  # requests in the loop at once, unless told otherwise
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Tokens:
    """New output tokens of a request, with the times they were computed."""

    ids: list[int]
    times: list[float]


@dataclass(frozen=True)
class Done:
    """The response is delivered (or refused, or failed): no more events follow."""

    finish_reason: str
    error: str | None


Event = Tokens | Done


@dataclass(eq=False)
class Stream:
    """One request as the front end follows it."""

    request: Request
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    sent: int = 0  # output tokens already handed to the front end (loop thread only)
    generated: int = 0  # output tokens of every sample so far (n > 1: more than `sent`)


@dataclass(frozen=True)
class LoopStats:
    """What /metrics shows: the state after the loop's last step, and running totals."""

    running: int = 0
    waiting: int = 0
    kv_total_slots: int = 0
    kv_allocated_slots: int = 0
    kv_live_slots: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    steps: int = 0
    in_flight: int = 0
    finished: dict[str, int] = field(default_factory=dict)


class EngineLoop:
    def __init__(
        self, driver: EngineDriver, wait_s: float = IDLE_WAIT_S, max_in_flight: int = MAX_IN_FLIGHT
    ) -> None:
        self.driver = driver
        self.wait_s = wait_s
        self.max_in_flight = max_in_flight
        self._in_flight = 0  # submitted and not yet closed (under _count_lock)
        self._count_lock = threading.Lock()
        self.stats = LoopStats(kv_total_slots=driver.engine.kv.total_slots)
        self.error: str | None = None  # why the loop stopped, if it failed
        self._inbox: queue.SimpleQueue[Stream] = queue.SimpleQueue()
        self._cancels: queue.SimpleQueue[Stream] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stopping = False
        self._streams: dict[Request, Stream] = {}
        self._finished: dict[str, int] = {}
        self._prompt_tokens = 0
        self._generation_tokens = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, name="servelab-engine", daemon=True)

    @property
    def engine(self) -> Engine:
        return self.driver.engine

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Finish the current step, fail whatever is still in flight, end the thread."""
        self._stopping = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def submit(self, request: Request) -> Stream | None:
        """Queue a validated request (front-end thread); its events arrive on the stream.
        None, and nothing queued, when `max_in_flight` requests are in the loop already."""
        with self._count_lock:
            if self._in_flight >= self.max_in_flight:
                return None
            self._in_flight += 1
        stream = Stream(request)
        self._inbox.put(stream)
        self._wake.set()
        return stream

    def cancel(self, stream: Stream) -> None:
        """Its client went away (front-end thread): free its KV before the next step."""
        self._cancels.put(stream)
        self._wake.set()

    def _run(self) -> None:
        try:
            while not self._stopping:
                self._wake.clear()
                self._take_arrivals()
                self._take_cancels()
                if not self.engine.has_unfinished():
                    self._publish()
                    self._wake.wait(self.wait_s)
                    continue
                self._step()
        except Exception as exc:  # noqa: BLE001  (every client is told; /health turns 503)
            self.error = f"{type(exc).__name__}: {exc}"
            log.exception("engine loop failed")
        finally:
            self._fail_remaining(self.error or "the server is shutting down")

    def _take_arrivals(self) -> None:
        events: list[tuple[Stream, Event]] = []
        while True:
            try:
                stream = self._inbox.get_nowait()
            except queue.Empty:
                break
            request = stream.request
            if self.driver.admit(request):
                self._streams[request] = stream
                self._prompt_tokens += request.prompt_len
            else:
                events.append((stream, self._close(request)))
        self._dispatch(events)

    def _take_cancels(self) -> None:
        events: list[tuple[Stream, Event]] = []
        while True:
            try:
                stream = self._cancels.get_nowait()
            except queue.Empty:
                break
            request = stream.request
            if self._streams.pop(request, None) is not None and self.driver.cancel(request):
                events.append((stream, self._close(request)))
        self._dispatch(events)

    def _step(self) -> None:
        result = self.driver.step()
        events: list[tuple[Stream, Event]] = []
        for request, stream in self._streams.items():
            count = len(request.output_ids)
            if count > stream.sent:
                new = Tokens(request.output_ids[stream.sent :], request.token_times[stream.sent :])
                events.append((stream, new))
                stream.sent = count
            generated = count + sum(len(s.output_ids) for s in request.samples)
            self._generation_tokens += generated - stream.generated
            stream.generated = generated
        for request in result.delivered:
            stream = self._streams.pop(request)
            events.append((stream, self._close(request)))
        self._dispatch(events)
        self._publish()

    def _close(self, request: Request) -> Done:
        """Count a request that left the engine (the driver recorded it); its last event."""
        reason = request.finish_reason or "error"
        self._finished[reason] = self._finished.get(reason, 0) + 1
        with self._count_lock:
            self._in_flight -= 1
        return Done(reason, request.error)

    def _dispatch(self, events: list[tuple[Stream, Event]]) -> None:
        """Hand a step's events to the front end in one call on its event loop."""
        if not events or self._loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the event loop closed: nobody listens
            self._loop.call_soon_threadsafe(_deliver, events)

    def _publish(self) -> None:
        kv = self.engine.kv.stats()
        self.stats = LoopStats(
            running=self.engine.scheduler.num_running(),
            waiting=self.engine.scheduler.num_waiting(),
            kv_total_slots=kv.total_slots,
            kv_allocated_slots=kv.allocated_slots,
            kv_live_slots=kv.live_slots,
            prompt_tokens=self._prompt_tokens,
            generation_tokens=self._generation_tokens,
            steps=self.engine.step_index,
            in_flight=self._in_flight,
            finished=dict(self._finished),
        )

    def _fail_remaining(self, error: str) -> None:
        """Every request still queued or in flight ends with `error` (the loop is over)."""
        admitted = {id(request) for request in self.driver.fail_in_flight(error)}
        pending = list(self._streams.values())
        self._streams.clear()
        while True:
            try:
                pending.append(self._inbox.get_nowait())
            except queue.Empty:
                break
        queued = [s.request for s in pending if id(s.request) not in admitted]
        fail_in_flight(queued, error, self.engine.clock, self.driver.sink)
        self._dispatch([(stream, self._close(stream.request)) for stream in pending])
        self._publish()


def _deliver(events: list[tuple[Stream, Event]]) -> None:
    for stream, event in events:
        stream.events.put_nowait(event)
