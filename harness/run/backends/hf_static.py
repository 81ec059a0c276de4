"""`backend=hf_static`: transformers' `generate` on padded batches, as users first serve.

The replay's `Client` hands requests over at their arrivals; whenever the model is free, the
requests that have arrived (up to `engine.max_batch_size`) form a batch, left-padded to the
longest prompt, and one `generate` call runs it until every row has its longest
`max_tokens` (or all stopped). A streamer stamps each generation step as it ends: a row's
tokens carry the times of the steps that made them. Every row is delivered when `generate`
returns, as static batching delivers. Rows are cut at their own `max_tokens` and after their
end-of-sequence token (unless `ignore_eos`); what `generate` computed past that is waste,
as it was in servers of that design.
"""

from __future__ import annotations

import queue
from collections import deque
from collections.abc import Callable

import torch
from transformers import GenerationConfig, LlamaForCausalLM
from transformers.generation.streamers import BaseStreamer

from servelab.engine.request import Request
from servelab.harness.measure.rundir import RunWriter
from servelab.harness.run.loop import IDLE_WAIT_S, fail_in_flight
from servelab.harness.run.replay import Client, progress_bar, requests_of
from servelab.workloads.spec import Workload


class StepStamps(BaseStreamer):
    """`generate` calls `put` with the prompt, then once per step: stamp every step."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.times: list[float] = []
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        del value
        if self._prompt_seen:
            self.times.append(self.clock())
        self._prompt_seen = True

    def end(self) -> None:
        pass


def generation_config(request: Request, eos: tuple[int, ...], pad: int) -> GenerationConfig:
    """The batch's sampling (the workload's, the same for every request)."""
    sampling = request.sampling
    sample = not sampling.greedy
    return GenerationConfig(
        do_sample=sample,
        temperature=sampling.temperature if sample else None,
        top_k=(sampling.top_k or None) if sample else None,
        top_p=sampling.top_p if sample else None,
        eos_token_id=None if sampling.ignore_eos else list(eos),
        pad_token_id=pad,
    )


@torch.inference_mode()
def run_batch(
    model: LlamaForCausalLM, batch: list[Request], clock: Callable[[], float], eos: tuple[int, ...]
) -> None:
    pad = min(eos, default=0)
    width = max(r.prompt_len for r in batch)
    ids = torch.full((len(batch), width), pad, dtype=torch.int64)
    mask = torch.zeros((len(batch), width), dtype=torch.int64)
    for row, request in enumerate(batch):
        ids[row, width - request.prompt_len :] = torch.tensor(request.prompt_ids)
        mask[row, width - request.prompt_len :] = 1
    config = generation_config(batch[0], eos, pad)
    config.max_new_tokens = max(r.sampling.max_tokens for r in batch)
    stamps = StepStamps(clock)
    start = clock()
    torch.manual_seed(batch[0].sampling.seed)
    device = model.device
    out = model.generate(
        ids.to(device), attention_mask=mask.to(device), generation_config=config, streamer=stamps
    )
    now = clock()
    for row, request in enumerate(batch):
        request.t_admitted = start
        tokens: list[int] = []
        for token in out[row, width:].tolist()[: request.sampling.max_tokens]:
            tokens.append(token)
            if token in eos and not request.sampling.ignore_eos:
                break
        request.output_ids = tokens
        request.token_times = stamps.times[: len(tokens)]
        stopped = bool(tokens) and tokens[-1] in eos and not request.sampling.ignore_eos
        request.finish("stop" if stopped else "length")
        request.deliver(now)


def replay_static(
    model: LlamaForCausalLM,
    workload: Workload,
    clock: Callable[[], float],
    writer: RunWriter,
    max_batch_size: int,
    eos: tuple[int, ...],
    progress: bool,
) -> None:
    requests = requests_of(workload)
    inbox: queue.SimpleQueue[Request] = queue.SimpleQueue()
    client = Client(requests, clock, inbox, workload.concurrency, workload.think_s)
    waiting: deque[Request] = deque()
    batch: list[Request] = []
    bar = progress_bar(len(requests), progress)
    recorded = 0
    client.start()
    try:
        while recorded < len(requests):
            if not waiting:
                try:
                    waiting.append(inbox.get(timeout=IDLE_WAIT_S))
                except queue.Empty:
                    continue
            while not inbox.empty():
                waiting.append(inbox.get_nowait())
            batch = [waiting.popleft() for _ in range(min(len(waiting), max_batch_size))]
            run_batch(model, batch, clock, eos)
            for request in batch:
                writer.request(request.record())
                client.completed(request)
                recorded += 1
                bar.update(1)
            batch = []
    except BaseException as exc:
        fail_in_flight(batch + list(waiting), f"{type(exc).__name__}: {exc}", clock, writer)
        raise
    finally:
        client.stop()
        bar.close()
