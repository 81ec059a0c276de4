"""The HTTP client of `backend=openai`: each arrival an async streaming request to
`/v1/completions` with the prompt as token ids, its tokens stamped as its chunks arrive
(`stream_tally`), its record written when the stream ends or fails; `slo.stop_early` asked while
requests are in flight. The run's own process sends with it (`endpoint`), or each worker process
its share of the schedule (`worker_client`, `endpoint_workers`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

from transformers import PreTrainedTokenizerBase

from servelab.engine.request import Request
from servelab.harness.measure.slo.early_stop import StoppedEarly, StopRecord
from servelab.harness.run.backends.endpoint_settings import (
    EndpointSettings,
)
from servelab.harness.run.backends.endpoint_workers import (
    RequestSink,
    WorkerJob,
)
from servelab.harness.run.backends.http_session import HTTPSession, SendStamp
from servelab.harness.run.backends.stream_tally import (
    StreamTally,
)
from servelab.harness.run.loop import fail_in_flight
from servelab.harness.run.replay import Client

Clock = Callable[[], float]
StopRule = Callable[[float], StopRecord | None]
STOP_CHECK_S = 0.25  # how often the stop rule is asked while no request finishes


def never_stop(now: float) -> StopRecord | None:
    del now
    return None


class _LoopInbox:
    """The `Client` thread's inbox: each arrival starts a request on the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, start: Callable[[Request], None]) -> None:
        self.loop = loop
        self.start = start

    def put(self, request: Request) -> None:
        self.loop.call_soon_threadsafe(self.start, request)


class EndpointClient:
    """Sends requests to the endpoint at their arrivals, over one HTTP session, and reads
    their streams; in the run's process or in a worker's."""

    def __init__(
        self,
        settings: EndpointSettings,
        session: HTTPSession,
        bodies: dict[str, bytes],
        tokenizer: PreTrainedTokenizerBase,
    ) -> None:
        self.settings = settings
        self.session = session
        self.bodies = bodies
        self.tokenizer = tokenizer

    async def send(
        self,
        requests: list[Request],
        clock: Clock,
        sink: RequestSink,
        concurrency: int | None = None,
        think_s: float = 0.0,
        stop: StopRule = never_stop,
    ) -> None:
        """Every request sent at its arrival (the in-process replay's `Client`), its record
        given to `sink` as it finishes. `stop` is asked after each and every
        `STOP_CHECK_S` whether the run can end early (`early_stop`): then every request not
        yet delivered is recorded as `stopped` and `StoppedEarly` raised. On an exception the
        requests in flight are cancelled and recorded failed."""
        loop = asyncio.get_running_loop()
        finished: asyncio.Queue[Request] = asyncio.Queue()
        in_flight: dict[Request, asyncio.Task[None]] = {}
        ended = False  # no request starts once the run has ended

        def start(request: Request) -> None:
            if ended:
                return
            task = loop.create_task(self._serve(request, clock))
            task.add_done_callback(lambda _: finished.put_nowait(request))
            in_flight[request] = task

        def end(unserved: list[Request], error: str, reason: str) -> None:
            nonlocal ended
            ended = True
            client.stop()
            for task in in_flight.values():
                task.cancel()
            for request in unserved:
                request.token_times = []  # a first token noted for the stop check only
            fail_in_flight(unserved, error, clock, sink, reason)

        def recorded(request: Request) -> None:
            del in_flight[request]
            record = request.record()
            record.output_len = len(record.token_times)
            sink.request(record)
            client.completed(request)

        client = Client(requests, clock, _LoopInbox(loop, start), concurrency, think_s)
        client.start()
        try:
            delivered = 0
            while delivered < len(requests):
                try:
                    request = await asyncio.wait_for(finished.get(), STOP_CHECK_S)
                except TimeoutError:
                    request = None
                if request is not None:
                    recorded(request)
                    delivered += 1
                stopped = stop(clock())
                if stopped is not None:
                    # delivered, its record not taken yet (its task's callback still queued)
                    for request in [r for r in in_flight if r.t_done is not None]:
                        recorded(request)
                    unserved = [r for r in requests if r.t_done is None]
                    end(unserved, stopped.reason(), "stopped")
                    raise StoppedEarly(stopped)
        except StoppedEarly:
            raise
        except BaseException as exc:
            end(list(in_flight), f"{type(exc).__name__}: {exc}", "error")
            raise
        finally:
            client.stop()

    async def _serve(self, request: Request, clock: Clock) -> None:
        """Send one request and read its stream into the request; never raises."""
        try:
            await asyncio.wait_for(self._stream(request, clock), self.settings.timeout_s)
        except TimeoutError:
            limit = self.settings.timeout_s
            request.finish("error", f"no complete response within endpoint.timeout_s={limit:g}")
        except Exception as exc:  # noqa: BLE001  (recorded with the request, the run goes on)
            request.finish("error", f"{type(exc).__name__}: {exc}")
        if request.t_done is None:
            request.deliver(clock())

    async def _stream(self, request: Request, clock: Clock) -> None:
        tally = StreamTally()
        headers = {"X-Request-Id": request.id, "Content-Type": "application/json"}
        async with self.session.client.post(
            self.session.url("/v1/completions"),
            data=self.bodies[request.id],
            headers=headers,
            trace_request_ctx=SendStamp(request, clock),
        ) as response:
            if response.status != 200:
                message = _message(await response.text())
                request.finish("error", f"HTTP {response.status}: {message}")
                return
            async for raw in response.content:
                now = clock()
                line = raw.decode().strip()
                data = line.removeprefix("data:").strip() if line.startswith("data:") else ""
                if not data:
                    continue
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    request.finish("error", f"the stream reported: {chunk['error']}")
                    return
                tally.add(chunk, now)
                if tally.times and not request.token_times:  # seen by the stop check
                    request.token_times = tally.times[:1]
        request.deliver(clock())
        settled = tally.settle(self.tokenizer)
        request.output_ids = settled.output_ids
        request.token_times = settled.token_times
        request.counters.update(settled.counters)
        if settled.cached_prompt_tokens is not None:
            request.cached_prompt_tokens = settled.cached_prompt_tokens
        reason = settled.finish_reason
        if reason in ("stop", "length"):
            request.finish(reason)
        else:
            request.finish("error", f"the stream ended with finish_reason {reason!r}")


def burst(requests: list[Request]) -> int:
    """How many requests arrive at the replay's first instant (open loop)."""
    first = requests[0].t_scheduled
    return sum(1 for request in requests if request.t_scheduled == first)


def worker_client(job: WorkerJob) -> Callable[[Clock, RequestSink], None]:
    """A worker's sender (`endpoint_workers`): its session opened and connected now, its
    share of the schedule sent when called."""
    session = HTTPSession(job.settings)
    session.open_connections(burst(job.requests))
    client = EndpointClient(job.settings, session, job.bodies, job.tokenizer)

    def send(clock: Clock, sink: RequestSink) -> None:
        try:
            session.run(client.send(job.requests, clock, sink))
        finally:
            session.close()

    return send


def _message(body: str) -> str:
    """The `error.message` of an error body, else its start."""
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return body[:300]
    if isinstance(error, dict):
        return str(error.get("message"))
    return str(error)
