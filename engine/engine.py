"""The engine: one `step()` is one scheduling decision and one model forward.

Each step lets the decoding strategy propose drafts, asks the scheduler for the batch (which
requests, how many tokens each feeds, any padding rows), says what that batch feeds (`Feed`),
runs it through the model runner, lets the decoding strategy accept tokens from the logits
of every sequence whose next token is due (and the first tokens of a request's other samples,
`parallel_sampling`), and hands the outcome to the one post-step update (`StepUpdate`:
append, fork, roll back, finish, free, deliver, record). It returns the responses
delivered at the end of the step and the step's record. Per-step Python work scales with the
number of requests, not tokens: positions and slots are built with tensor operations.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from servelab.base.errors import ConfigError
from servelab.engine.decoding import Decoder, Verification
from servelab.engine.kv_manager import KVManager
from servelab.engine.model_runner import Feed, Runner
from servelab.engine.parallel_sampling import fork_samples
from servelab.engine.request import Request
from servelab.engine.scheduling import ScheduledSeq, Scheduler
from servelab.engine.step_update import StepOutput, StepResult, StepUpdate


@dataclass(frozen=True)
class Rejection:
    """Why a request can never be served here; `limit` when the strategy's step limits are
    the reason (a configuration error for a workload planned in advance)."""

    reason: str
    limit: ConfigError | None = None


class Engine:
    def __init__(self, runner: Runner, update: StepUpdate) -> None:
        self.runner = runner
        self.update = update  # holds the KV manager, scheduler and decoder the step uses
        self.pad_token_id = min(update.stop_token_ids, default=0)  # what padding rows are fed
        self.step_index = 0

    @property
    def kv(self) -> KVManager:
        """The KV manager the scheduler admits into."""
        return self.update.kv

    @property
    def scheduler(self) -> Scheduler:
        return self.update.scheduler

    @property
    def decoder(self) -> Decoder:
        return self.update.decoder

    @property
    def clock(self) -> Callable[[], float]:
        return self.update.clock

    @property
    def max_context(self) -> int:
        return self.update.max_context

    def add_request(self, request: Request) -> bool:
        """Queue a request; False, with the request finished as `rejected` and the reason
        in its `error`, when it can never be served."""
        rejection = self.rejection(request)
        if rejection is not None:
            request.close("rejected", self.clock(), rejection.reason)
            return False
        self.scheduler.add(request)
        return True

    def rejection(self, request: Request) -> Rejection | None:
        """Why `request` can never be served here (None: it can)."""
        limit = self.scheduler.limit_error(request)
        if limit is not None:
            return Rejection(str(limit), limit)
        if request.prompt_len >= self.max_context:
            return Rejection(
                f"prompt of {request.prompt_len} tokens leaves no room in a context of "
                f"{self.max_context}"
            )
        if not self.kv.fits_empty(request):
            return Rejection(
                f"needs {request.max_total_tokens} tokens of KV, more than the whole cache "
                f"holds ({self.kv.total_slots})"
            )
        return None

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def cancel(self, request: Request) -> bool:
        """Drop a request whose client went away, between steps: the scheduler forgets it, its
        KV returns to the cache, and it finishes as `cancelled` (even if it had finished and
        its response was only held). False, and nothing changes, once it was delivered."""
        if request.t_done is not None:
            return False
        for sample in request.every_sample:
            self.scheduler.cancel(sample)
            self.decoder.release(sample)
        self.update.groups.forget(request)
        request.close("cancelled", self.clock())
        return True

    def step(self) -> StepResult | None:
        """Run one step; None when the scheduler has nothing to run or deliver."""
        update = self.update
        clock, decoder, scheduler = update.clock, update.decoder, update.scheduler
        t_start = clock()
        decoder.propose(scheduler.running_requests())
        plan = scheduler.schedule()
        for request in plan.preempted:
            request.preempt_times.append(t_start)
            decoder.release(request)
        if not plan.seqs:
            if not plan.delivered:
                return None
            return self._finish(StepOutput(self.step_index, plan, None, [], [], t_start, 0.0))
        feed, due = self._feed(plan.seqs, t_start)
        t_model = clock()
        logits = self.runner.run(update.kv, feed)
        accepted = decoder.accept(logits, due) if due else []
        forks = fork_samples(logits, due)
        model_s = clock() - t_model
        return self._finish(
            StepOutput(self.step_index, plan, feed, due, accepted, t_start, model_s, forks)
        )

    def _finish(self, output: StepOutput) -> StepResult:
        result = self.update.apply(output)
        self.step_index += 1
        return result

    def _feed(self, seqs: list[ScheduledSeq], now: float) -> tuple[Feed, list[Verification]]:
        """What the scheduled sequences feed, and which of them have their next token due; a
        request computing for the first time is admitted `now`."""
        requests: list[Request] = []
        starts: list[int] = []
        fed: list[int] = []
        ids: list[int] = []
        rows: list[int] = []
        due: list[Verification] = []
        row = 0
        for seq in seqs:
            request, real, pad = seq.request, seq.num_new_tokens, seq.num_pad_tokens
            if request.t_admitted is None:
                request.t_admitted = now
            start = request.num_computed_tokens
            end, known = start + real, request.num_tokens
            requests.append(request)
            starts.append(start)
            fed.append(real + pad)
            ids += request.token_slice(start, end)
            if pad:
                ids += [self.pad_token_id] * pad
            if real and end >= known:  # the next token is due: score the last known token
                first = row + known - 1 - start  # and every draft fed after it
                rows += range(first, row + real)
                due.append(Verification(request, end - known))
            row += real + pad
        return Feed(requests, starts, fed, ids, rows), due
