"""`endpoint.workers=N`: the endpoint client in N processes, for rates one cannot keep.

One process sends several hundred requests a second on time (`python -m
scripts.client_bench` says how many on a machine; each leaves what it built before its clock
starts out of the garbage collector's passes, `collector.heap_frozen`); past that its event
loop falls behind and the run would measure the client, not the server. As inference-perf
does, the open-loop schedule is then dealt over N worker processes (arrival i to worker i
mod N): each has its own event loop, HTTP session and connection pool, and all read the
run's one clock (`time.perf_counter` is the system's monotonic clock, the same in every
process; each worker is handed the run's time 0).
The workers start, connect and encode their requests while the run is prepared; each sends
its arrivals once told the time 0 and hands every finished request's record back through one
queue, and the run writes them, as they come, into its one `requests.jsonl`. The union of the
workers' arrivals is the workload's schedule, request by request. A closed loop (users
waiting on their own responses) stays in one process.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import queue
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Protocol

from servelab.base.errors import ConfigError
from servelab.base.records import RequestRecord
from servelab.engine.request import Request
from servelab.harness.run.backends.endpoint_settings import EndpointSettings
from servelab.harness.run.collector import heap_frozen

READY_TIMEOUT_S = 120.0  # a worker imports the package and opens its connections
PER_WORKER_RATE = 800.0  # req/s one worker is given under `auto` (`scripts.client_bench`)


def workers_for(
    setting: int | str, requests: list[Request], closed_loop: bool, stops_early: bool = False
) -> int:
    """How many processes send the schedule: `endpoint.workers` as set, or under `auto` (the
    default) one per PER_WORKER_RATE of the schedule's mean rate, at most one per CPU; one
    for a closed loop or a run that stops early (one process watches the verdict)."""
    if setting == "auto":
        if closed_loop or stops_early or len(requests) < 2:
            return 1
        span = requests[-1].t_scheduled - requests[0].t_scheduled
        rate = len(requests) / max(span, 1.0)  # a burst at once: its requests in a second
        return max(1, min(os.cpu_count() or 1, math.ceil(rate / PER_WORKER_RATE)))
    assert isinstance(setting, int), "endpoint_settings checked it"
    if setting > 1 and closed_loop:
        raise ConfigError(
            "endpoint.workers",
            "a closed loop's users wait on their own responses in one process; use workers=1",
        )
    return setting


@dataclass(frozen=True)
class WorkerJob:
    """What one worker sends: its share of the requests, their encoded bodies."""

    index: int
    settings: EndpointSettings
    requests: list[Request]
    bodies: dict[str, bytes]
    tokenizer: Any  # re-tokenises a stream whose server reported no usage


class RequestSink(Protocol):
    """Where a client hands each finished request's record."""

    def request(self, record: RequestRecord) -> None: ...


Sender = Callable[[Callable[[], float], RequestSink], None]  # (clock, sink): send the share


class _QueueSink:
    def __init__(self, records: Any) -> None:
        self.records = records

    def request(self, record: RequestRecord) -> None:
        self.records.put(record)


def _work(
    job: WorkerJob, make: Callable[[WorkerJob], Sender], commands: Connection, records: Any
) -> None:
    """A worker: connected, ready; then, told the run's time 0, its arrivals; every record,
    then None (or what went wrong)."""
    try:
        send = make(job)
        with heap_frozen():  # no full collection pausing the sends
            commands.send("ready")
            origin = commands.recv()
            send(lambda: time.perf_counter() - origin, _QueueSink(records))
        records.put(None)
    except BaseException:  # noqa: BLE001  (said to the run, which fails with it)
        records.put(f"endpoint worker {job.index}: {traceback.format_exc(limit=4)}")


class WorkerPool:
    """N worker processes, started and connected; `replay` runs them on the run's clock."""

    def __init__(self, jobs: list[WorkerJob], make: Callable[[WorkerJob], Sender]) -> None:
        context = multiprocessing.get_context("spawn")
        self.records = context.Queue()
        self.processes, self.commands = [], []
        for job in jobs:
            ours, theirs = context.Pipe()
            process = context.Process(
                target=_work, args=(job, make, theirs, self.records), daemon=True
            )
            process.start()
            self.processes.append(process)
            self.commands.append(ours)
        for index, command in enumerate(self.commands):
            if not command.poll(READY_TIMEOUT_S):
                said = self._said()
                self.close()
                raise RuntimeError(said or f"endpoint worker {index}: not ready in time")
            command.recv()

    def _said(self) -> str | None:
        """What a worker said went wrong, if one did."""
        try:
            item = self.records.get(timeout=0.1)
        except queue.Empty:
            return None
        return item if isinstance(item, str) else None

    def replay(self, origin: float, total: int, write: Callable[[RequestRecord], None]) -> None:
        """Every worker's arrivals from `origin` (the run's time 0 on `time.perf_counter`);
        `write` gets each of the `total` records as it comes."""
        for command in self.commands:
            command.send(origin)
        finished = 0
        while finished < len(self.processes):
            try:
                item = self.records.get(timeout=1.0)
            except queue.Empty:
                if not all(p.is_alive() for p in self.processes):
                    raise RuntimeError("an endpoint worker died without a word") from None
                continue
            if item is None:
                finished += 1
            elif isinstance(item, str):
                raise RuntimeError(item)
            else:
                write(item)
                total -= 1
        if total:
            raise RuntimeError(f"the endpoint workers returned {total} records too few")

    def close(self) -> None:
        for process in self.processes:
            if process.is_alive():
                process.terminate()
            process.join(timeout=5)
