"""`backend=openai`: drive any OpenAI-compatible server with the workload, over HTTP.

Before the clock starts the endpoint is checked (`endpoint_settings`: its URL, the API key's
environment variable; then the server's model list, which must hold `endpoint.model`, or
exactly one model when none is named), the HTTP session is opened (`http_session`) and every
request body encoded. The replay
then uses the in-process replay's own `Client` thread, so arrivals are identical: open loop
at the workload's times, closed loop when the same user's previous response was delivered,
plus think time; `t_scheduled` is that arrival, whatever the sender is doing. Each arrival
starts an async streaming request to `/v1/completions` with the prompt as token ids (every
backend sees the identical prompt); `t_send` is when its request headers were written to the
socket. Tokens are stamped as their chunks arrive (`stream_tally`), `t_done` when the stream
ends. A request that fails (an HTTP error status, a broken connection, `endpoint.timeout_s`
passed) is recorded with `finish_reason: error` and its error. `slo.stop_early` ends the run
once its verdict can only be a failure, as in process (a knee search's rate probes). With
`endpoint.workers` above one, worker processes send the schedule, each its share
(`endpoint_workers`). Where the server publishes Prometheus metrics, they are scraped beside
the records while the requests go (`measure.server_metrics`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from tqdm import tqdm
from transformers import PreTrainedTokenizerBase

from servelab.base.errors import ConfigError
from servelab.base.records import RequestRecord
from servelab.engine.request import Request
from servelab.harness.measure.flags import ESTIMATED, Flag
from servelab.harness.measure.prompt_cache import PREFIX_IN_RUN, prefixes_in_run
from servelab.harness.measure.rundir import RunRecords, RunWriter
from servelab.harness.measure.server_metrics import (
    FILE,
    ServerGauges,
    ServerMetricsScraper,
    find_gauges,
)
from servelab.harness.measure.slo.early_stop import StoppedEarly, StopRecord, stop_rule
from servelab.harness.measure.slo.limits import SLO
from servelab.harness.run.backends.base import (
    Backend,
    PeerInputs,
    check_one_sample,
    peer_inputs,
)
from servelab.harness.run.backends.endpoint_settings import (
    EndpointSettings,
    auth_headers,
    choose_model,
    request_body,
)
from servelab.harness.run.backends.endpoint_workers import (
    RequestSink,
    WorkerJob,
    WorkerPool,
    workers_for,
)
from servelab.harness.run.backends.http_session import HTTPSession, SendStamp
from servelab.harness.run.backends.stream_tally import (
    ESTIMATED_COUNT,
    ESTIMATED_TIMES,
    StreamTally,
)
from servelab.harness.run.clock import RunClock
from servelab.harness.run.collector import heap_frozen
from servelab.harness.run.loop import fail_in_flight
from servelab.harness.run.replay import Client, progress_bar, requests_of

if TYPE_CHECKING:
    from servelab.harness.run.spec import RunSpec

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


class EndpointBackend(Backend):
    def __init__(
        self,
        settings: EndpointSettings,
        session: HTTPSession,
        model: str,
        models: list[str],
        inputs: PeerInputs,
        seeds: dict[str, int],
        requests: list[Request],
        workers: int,
        slo: SLO,
        gauges: tuple[ServerGauges | None, str],
    ) -> None:
        self.settings = settings
        self.gauges, self.gauges_note = gauges
        self.session = session
        self.model = model
        self.models = models
        self.workload = inputs.workload
        self.tokenizer = inputs.tokenizer
        self.model_file = inputs.model_file
        self.model_sha256 = inputs.model_sha256
        self.seeds = seeds
        self.device = torch.device("cpu")
        self.requests = requests
        shared = prefixes_in_run([request.prompt_ids for request in requests])
        for request, prefix in zip(requests, shared, strict=True):  # what this run can cache
            request.counters[PREFIX_IN_RUN] = prefix
        self.slo = slo  # its `stop_early` ends a run once its verdict can only be a failure
        bodies = {  # encoded now, not while requests are due
            request.id: json.dumps(request_body(request, model, settings.extra_body)).encode()
            for request in self.requests
        }
        self.sample_body = bodies[self.requests[0].id]
        self.client = EndpointClient(settings, session, bodies, self.tokenizer)
        self.workers = (
            WorkerPool([self._job(i, workers) for i in range(workers)], worker_client)
            if workers > 1
            else None
        )

    def _job(self, index: int, workers: int) -> WorkerJob:
        """Worker `index`'s share: every `workers`-th arrival from its `index`-th."""
        share = self.requests[index::workers]
        bodies = {request.id: self.client.bodies[request.id] for request in share}
        return WorkerJob(index, self.settings, share, bodies, self.tokenizer)

    @classmethod
    def prepare(cls, spec: RunSpec, clock: RunClock, progress: bool) -> EndpointBackend:
        del clock, progress  # nothing is timed or loaded before the run's clock starts
        settings = spec.endpoint
        if settings is None:
            raise ConfigError("backend", f"backend={spec.backend} sends to no endpoint")
        session = HTTPSession(settings)
        try:
            models = session.models()
            model = choose_model(settings, models)
            inputs = peer_inputs(spec.model, spec.workload)
            workload = inputs.workload
            check_one_sample(workload, "an endpoint, read as a stream (one choice),")
            requests = requests_of(workload)
            slo = spec.slo
            stops = slo.stop_early is not None
            workers = workers_for(
                settings.workers, requests, workload.concurrency is not None, stops
            )
            if workers > 1 and stops:
                raise ConfigError(
                    "slo.stop_early", "one client process watches the verdict; endpoint.workers=1"
                )
            if workers == 1:
                session.open_connections(workload.concurrency or burst(requests))
            gauges = (
                find_gauges(settings.url, auth_headers(settings), min(settings.timeout_s, 5.0))
                if settings.metrics_period_s is not None
                else (None, "not scraped: endpoint.metrics_period_s=null")
            )
            return cls(
                settings, session, model, models, inputs, spec.seeds, requests, workers, slo,
                gauges,
            )  # fmt: skip
        except BaseException:
            session.close()
            raise

    @property
    def label(self) -> str:
        return self.settings.label or f"openai:{self.model}"

    def describe(self) -> dict[str, Any]:
        sample = json.loads(self.sample_body)  # what was sent
        sample["prompt"] = "<the request's prompt token ids>"
        return {
            "strategy": {"name": self.label, "backend": "openai", "model": self.model},
            "backend": {
                "kind": "openai",
                "url": self.settings.url,
                "model": self.model,
                "server_models": self.models,
                "api_key_env": self.settings.api_key_env,
                "request_body": sample,
                "timeout_s": self.settings.timeout_s,
                "max_connections": self.settings.max_connections,
                "workers": 1 if self.workers is None else len(self.workers.processes),
                "server_metrics": {
                    "period_s": self.settings.metrics_period_s,
                    "source": None if self.gauges is None else self.gauges.source,
                    "note": self.gauges_note,
                },
            },
        }

    def replay(
        self, clock: Callable[[], float], writer: RunWriter, run_dir: Path, progress: bool
    ) -> None:
        bar = progress_bar(len(self.requests), progress)
        sink = _Progress(writer, bar)
        workload = self.workload
        scraper = None
        if self.gauges is not None and self.settings.metrics_period_s is not None:
            period = self.settings.metrics_period_s
            scraper = ServerMetricsScraper(self.gauges, run_dir / FILE, period, clock)
            scraper.start()
        try:
            if self.workers is not None:
                origin = time.perf_counter() - clock()  # the run's time 0, for every process
                self.workers.replay(origin, len(self.requests), sink.request)
            else:
                stop = stop_rule(self.slo, self.requests)
                with heap_frozen():  # no full collection pausing the sends
                    self.session.run(
                        self.client.send(
                            self.requests, clock, sink, workload.concurrency, workload.think_s, stop
                        )
                    )
        finally:
            if scraper is not None:
                scraper.stop()
            bar.close()
            self.session.close()
            if self.workers is not None:
                self.workers.close()

    def flags(self, records: RunRecords) -> list[Flag]:
        counters = [record.counters for record in records.requests]
        flags = []
        estimated_times = sum(ESTIMATED_TIMES in str(c.get("token_times_from")) for c in counters)
        if estimated_times:
            text = (
                f"{estimated_times} requests: tokens per chunk not reported by the server, "
                "counted as one per chunk"
            )
            flags.append(Flag(ESTIMATED, text))
        retokenised = sum(c.get("token_count_from") == ESTIMATED_COUNT for c in counters)
        if retokenised:
            text = f"{retokenised} requests: no usage from the server, output re-tokenised"
            flags.append(Flag(ESTIMATED, text))
        return flags


def burst(requests: list[Request]) -> int:
    """How many requests arrive at the replay's first instant (open loop)."""
    first = requests[0].t_scheduled
    return sum(1 for request in requests if request.t_scheduled == first)


class _Progress:
    """The run's records, written as they come, with the progress bar."""

    def __init__(self, writer: RunWriter, bar: tqdm) -> None:
        self.writer, self.bar = writer, bar

    def request(self, record: RequestRecord) -> None:
        self.writer.request(record)
        self.bar.update(1)


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
