"""Parallel sampling: a request for n samples of one prompt (the vLLM paper's "more complex
decoding", OpenAI's `n`).

The prompt is computed once, as sample 0. In the step that computes its last prompt token,
the logits row that gives sample 0 its first token also gives every other sample its first
token, each drawn from its own generator (`SamplingParams.sample_index`); those samples are
forked then (`fork_samples`): each continues from the computed prompt, sharing its KV where the
KV manager can share (paged: the same blocks, copied on the first write into a shared one) or
holding its own copy (contiguous: a slab of its own, the prompt's KV copied in). From then on
every sample is a sequence of its own. The response is delivered once, when the last of its
samples is delivered (`SampleGroups`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from servelab.engine.decoding import Verification
from servelab.engine.request import Request
from servelab.engine.sampler import sample


def sample_id(request_id: str, index: int) -> str:
    """The id of sample `index` of a request (sample 0 keeps the request's own id)."""
    return request_id if index == 0 else f"{request_id}#{index}"


def due_to_fork(request: Request) -> bool:
    """Sample 0 of a request for n > 1 samples, whose first token this step gives."""
    return request.sampling.n > 1 and request.parent is None and not request.output_ids


@dataclass(frozen=True)
class Fork:
    """A sample to start beside its sample 0, and the first token drawn for it."""

    sample: Request
    first_token: int


def fork_samples(logits: torch.Tensor, due: list[Verification]) -> dict[Request, list[Fork]]:
    """For each due sequence that is sample 0 about to take its first token, its other
    samples with their first tokens, drawn from that same logits row (`StepUpdate` appends
    them with sample 0's). `logits` holds the rows of `due` one after another, as
    `Decoder.accept` reads them."""
    forks: dict[Request, list[Fork]] = {}
    row = 0
    for verification in due:
        request = verification.request
        if due_to_fork(request):
            samples = [_sample_of(request, k) for k in range(1, request.sampling.n)]
            rows = logits[row : row + 1].expand(len(samples), -1)
            tokens = sample(rows, samples)
            forks[request] = [Fork(s, t) for s, t in zip(samples, tokens, strict=True)]
        row += verification.num_drafts + 1
    return forks


def _sample_of(parent: Request, index: int) -> Request:
    return Request(
        id=sample_id(parent.id, index),
        prompt_ids=parent.prompt_ids,
        sampling=replace(parent.sampling, sample_index=index),
        t_scheduled=parent.t_scheduled,
        t_send=parent.t_send,
        excluded=parent.excluded,
        t_admitted=parent.t_admitted,
        parent=parent,
    )


class SampleGroups:
    """Holds the delivered samples of a request until the last one is delivered."""

    def __init__(self) -> None:
        self._delivered: dict[Request, int] = {}  # sample 0 -> its samples delivered so far

    def complete(self, delivered: list[Request]) -> list[Request]:
        """Of the samples the scheduler delivered now, the requests whose every sample is
        now delivered (sample 0 stands for its request)."""
        done = []
        for request in delivered:
            head = request.parent or request
            count = self._delivered.pop(head, 0) + 1
            if count >= head.sampling.n:
                done.append(head)
            else:
                self._delivered[head] = count
        return done

    def forget(self, request: Request) -> None:
        """A request left (cancelled) before all its samples were delivered."""
        self._delivered.pop(request, None)
