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

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from tqdm import tqdm

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
from servelab.harness.measure.slo.early_stop import stop_rule
from servelab.harness.measure.slo.limits import SLO
from servelab.harness.run.backends.base import (
    Backend,
    PeerInputs,
    check_one_sample,
    peer_inputs,
)
from servelab.harness.run.backends.endpoint_client import EndpointClient, burst, worker_client
from servelab.harness.run.backends.endpoint_settings import (
    EndpointSettings,
    auth_headers,
    choose_model,
    request_body,
)
from servelab.harness.run.backends.endpoint_workers import (
    WorkerJob,
    WorkerPool,
    workers_for,
)
from servelab.harness.run.backends.http_session import HTTPSession
from servelab.harness.run.backends.stream_tally import (
    ESTIMATED_COUNT,
    ESTIMATED_TIMES,
)
from servelab.harness.run.clock import RunClock
from servelab.harness.run.collector import heap_frozen
from servelab.harness.run.replay import progress_bar, requests_of

if TYPE_CHECKING:
    from servelab.harness.run.spec import RunSpec


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
        self.serves(inputs, torch.device("cpu"), seeds)  # the client's process
        self.tokenizer = inputs.tokenizer
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


class _Progress:
    """The run's records, written as they come, with the progress bar."""

    def __init__(self, writer: RunWriter, bar: tqdm) -> None:
        self.writer, self.bar = writer, bar

    def request(self, record: RequestRecord) -> None:
        self.writer.request(record)
        self.bar.update(1)
