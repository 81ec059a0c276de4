"""A request's state as it moves through the engine.

`num_computed_tokens` is the one counter every strategy moves: it catches up with
`len(all_token_ids)` as prefill chunks and decode steps run; a prefix-cache hit advances it
without compute; preemption by recompute resets it to zero; speculative rollback moves it
back. `prompt_ids + output_ids` is always the full token sequence; `draft_ids` are proposed
tokens after it that the next step feeds for verification and that are not yet part of it.

A request for `n` > 1 samples is one `Request` (sample 0) until its prompt is computed; then
the engine forks its other samples (`samples`, each with its `parent`): they continue from
the same prompt KV, each drawing from its own generator (`SamplingParams.sample_index`), and
the response is delivered once, when every sample has finished.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from servelab.base.records import RequestRecord


class RequestState(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    ignore_eos: bool = False
    seed: int = 0
    n: int = 1  # samples of the same prompt (OpenAI's `n`; the vLLM paper's parallel sampling)
    sample_index: int = 0  # which of the n samples: part of every random draw's seed

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(eq=False)
class Request:
    id: str
    prompt_ids: list[int]
    sampling: SamplingParams
    t_scheduled: float = 0.0
    t_send: float | None = None
    excluded: bool = False
    state: RequestState = RequestState.WAITING
    num_computed_tokens: int = 0
    output_ids: list[int] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)
    draft_ids: list[int] = field(default_factory=list)  # proposed, fed next step, unverified
    finish_reason: str | None = None
    error: str | None = None
    t_done: float | None = None  # when the complete response was delivered
    preemptions: int = 0
    preempt_times: list[float] = field(default_factory=list)
    t_admitted: float | None = None  # first step that computed any of its tokens
    cached_prompt_tokens: int = 0
    counters: dict[str, float] = field(default_factory=dict)  # strategy-specific, per request
    parent: Request | None = None  # sample 0 of the request this sample belongs to
    samples: list[Request] = field(default_factory=list)  # samples 1 .. n-1, once forked

    @property
    def seats(self) -> int:
        """Batch rows the request will hold: all n while its samples are still to fork."""
        return self.sampling.n if self.parent is None and not self.samples else 1

    @property
    def every_sample(self) -> list[Request]:
        """This request (sample 0) and its other samples forked so far, in index order."""
        return [self, *self.samples]

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_pending_tokens(self) -> int:
        """Tokens the next step may feed: known but not computed, then the drafts."""
        return self.num_tokens + len(self.draft_ids) - self.num_computed_tokens

    @property
    def max_total_tokens(self) -> int:
        """Prompt plus the most output the request may produce: what reserve-the-maximum holds."""
        return len(self.prompt_ids) + self.sampling.max_tokens

    @property
    def is_finished(self) -> bool:
        return self.state is RequestState.FINISHED

    def token_slice(self, start: int, end: int) -> list[int]:
        """Tokens at positions `start .. end - 1` (drafts after the known tokens), without
        copying the whole sequence."""
        cut = len(self.prompt_ids)
        if end > self.num_tokens:
            return (
                self.token_slice(start, self.num_tokens)
                + self.draft_ids[max(start - self.num_tokens, 0) : end - self.num_tokens]
            )
        if end <= cut:
            return self.prompt_ids[start:end]
        if start >= cut:
            return self.output_ids[start - cut : end - cut]
        return self.prompt_ids[start:] + self.output_ids[: end - cut]

    def finish(self, reason: str, error: str | None = None) -> None:
        self.state = RequestState.FINISHED
        self.finish_reason = reason
        self.error = error
        self.draft_ids = []

    def deliver(self, now: float) -> None:
        """The complete response (every sample) is handed back now: the one place `t_done`
        is set."""
        for sample in self.every_sample:
            sample.t_done = now

    def close(self, reason: str, now: float, error: str | None = None) -> None:
        """End a request that leaves without being served to its end (rejected, cancelled,
        failed): it and every sample finished so, whatever they had produced, and delivered
        at once."""
        for sample in self.every_sample:
            sample.finish(reason, error)
        self.deliver(now)

    def all_token_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    def records(self) -> list[RequestRecord]:
        """The `requests.jsonl` lines for this request: one per sample (DESIGN.md, run
        directory)."""
        return [sample.record() for sample in self.every_sample]

    def record(self) -> RequestRecord:
        """The `requests.jsonl` line for this sample."""
        return RequestRecord(
            id=self.id,
            prompt_len=self.prompt_len,
            output_len=len(self.output_ids),
            t_scheduled=self.t_scheduled,
            t_send=self.t_send,
            t_done=self.t_done,
            token_times=list(self.token_times),  # copies: a run keeps its records as written
            output_ids=list(self.output_ids),
            finish_reason=self.finish_reason,
            error=self.error,
            preemptions=self.preemptions,
            preempt_times=list(self.preempt_times),
            t_admitted=self.t_admitted,
            cached_prompt_tokens=self.cached_prompt_tokens,
            excluded=self.excluded,
            counters=dict(self.counters),
            sample_index=self.sampling.sample_index,
        )
