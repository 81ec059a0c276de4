"""`backend=hf_continuous`: transformers' own continuous batching
(`transformers.generation.continuous_batching`), fed at the workload's arrivals.

The replay's `Client` hands each request to the batching manager as it arrives (its
generation thread admits it at its next step); transformers stamps every generated token
(`record_timestamps`, on the same monotonic clock as the run, shifted to run seconds) and
the response is delivered when its finished output is collected. The KV cache is sized from
`engine.kv_budget` and the step limits from `engine.max_batch_size` and
`engine.max_num_batched_tokens`, so the same limits apply as to servelab's strategies; the
rest is transformers' defaults.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from transformers import GenerationConfig, LlamaForCausalLM
from transformers.generation.configuration_utils import ContinuousBatchingConfig

from servelab.engine.request import Request
from servelab.harness.measure.rundir import RunWriter
from servelab.harness.run.backends.hf_static import generation_config
from servelab.harness.run.loop import IDLE_WAIT_S, fail_in_flight
from servelab.harness.run.replay import Client, progress_bar, requests_of
from servelab.workloads.spec import Workload

READY_TIMEOUT_S = 600.0  # allocating the cache of a large KV budget takes a while on a CPU


@dataclass(frozen=True)
class ContinuousLimits:
    num_blocks: int
    page_size: int
    max_batch_tokens: int
    max_requests_per_batch: int

    def config(self) -> ContinuousBatchingConfig:
        return ContinuousBatchingConfig(**asdict(self))


class _ManagerInbox:
    """The `Client`'s inbox: hand each arriving request to the manager."""

    def __init__(self, manager: Any, eos: tuple[int, ...]) -> None:
        self.manager = manager
        self.eos = eos

    def put(self, request: Request) -> None:
        self.manager.add_request(
            request.prompt_ids,
            request_id=request.id,
            max_new_tokens=request.sampling.max_tokens,
            record_timestamps=True,
            eos_token_id=-1 if request.sampling.ignore_eos else list(self.eos),
        )


def _fill(request: Request, output: Any, offset: float, eos: tuple[int, ...], now: float) -> None:
    """Copy a finished output into the request (transformers' times shifted by `offset`)."""
    request.output_ids = list(output.generated_tokens)
    request.token_times = [t - offset for t in (output.timestamps or [])]
    if output.lifespan[0] > 0:
        request.t_admitted = output.lifespan[0] - offset
    request.deliver(now)
    if output.error is not None:
        request.finish("error", str(output.error))
        return
    tokens = request.output_ids
    stopped = bool(tokens) and tokens[-1] in eos and not request.sampling.ignore_eos
    request.finish("stop" if stopped else "length")


class ContinuousRunner:
    """transformers' batching manager, started before the run's clock: creating its batch
    processor allocates the whole paged cache, which is set-up, not serving."""

    def __init__(
        self,
        model: LlamaForCausalLM,
        limits: ContinuousLimits,
        eos: tuple[int, ...],
        first: Request,
    ) -> None:
        logging.getLogger("ContinuousBatchingLogger").setLevel(logging.WARNING)  # not every step
        config: GenerationConfig = generation_config(first, eos, min(eos, default=0))
        config.eos_token_id = list(eos)  # the default; each request passes its own (-1: none)
        self.manager = model.init_continuous_batching(
            generation_config=config, continuous_batching_config=limits.config()
        )
        self.eos = eos

    def start(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        self.manager.start()
        deadline = time.perf_counter() + timeout_s
        while self.manager.batch_processor is None:
            if not self.manager.is_running() or time.perf_counter() > deadline:
                raise RuntimeError("transformers' continuous batching did not start")
            time.sleep(0.05)

    def replay(
        self, workload: Workload, clock: Callable[[], float], writer: RunWriter, progress: bool
    ) -> None:
        requests = requests_of(workload)
        by_id = {r.id: r for r in requests}
        manager = self.manager
        offset = time.perf_counter() - clock()  # transformers stamps on perf_counter
        inbox = _ManagerInbox(manager, self.eos)
        client = Client(requests, clock, inbox, workload.concurrency, workload.think_s)
        bar = progress_bar(len(requests), progress)
        recorded = 0
        client.start()
        try:
            while recorded < len(requests):
                output = manager.get_result(timeout=IDLE_WAIT_S)
                if output is None:
                    if not manager.is_running():
                        raise RuntimeError("transformers' continuous batching loop stopped")
                    continue
                if not output.is_finished():
                    continue
                request = by_id[output.request_id]
                _fill(request, output, offset, self.eos, clock())
                writer.request(request.record())
                client.completed(request)
                recorded += 1
                bar.update(1)
        except BaseException as exc:
            unfinished = [r for r in requests if r.t_send is not None and r.t_done is None]
            fail_in_flight(unfinished, f"{type(exc).__name__}: {exc}", clock, writer)
            raise
        finally:
            client.stop()
            manager.stop(block=True, timeout=30)
            bar.close()
