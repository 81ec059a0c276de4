"""Ending a run as soon as its SLO verdict can only be a failure (`slo.stop_early`).

A probe far over saturation takes the longest of any run (its queue grows through the whole
window) and says the least. `EarlyStop` watches the counted requests (warm-up and cool-down
left out, as the attainment leaves them out) and keeps the ones that have certainly missed
the SLO: those delivered that missed it, and those still in flight whose latency is already
past a limit, whatever happens to them next:

- TTFT: no first token yet, and more than its TTFT limit (`SLO.ttft_limit`) since its arrival;
- E2E: not delivered, and more than `e2e_s` since its arrival;
- normalized latency: not delivered, and the time since arrival over its most output tokens
  (`max_tokens`) already above the limit (fewer tokens only raise it);
- TPOT: not delivered, and the time since its first token over its most remaining gaps
  (`max_tokens - 1`) already above the limit.

With n counted requests of which m certainly missed, the attainment is at most (n - m) / n.
When even that best case's Wilson interval at `slo.stop_early` (a confidence) lies below
`slo.attainment`, the run's verdict is a failure at that confidence whatever the other
requests do, and the run stops: what was in flight or not yet sent is recorded as `stopped`,
and the summary's `status` is `stopped`, with the evidence (`stopped_early`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from statistics import NormalDist

from servelab.engine.request import Request
from servelab.harness.measure.metrics import request_latency
from servelab.harness.measure.slo.limits import SLO


def wilson(met: int, counted: int, confidence: float) -> tuple[float, float]:
    """The Wilson score interval of a share met/counted at `confidence` (two-sided)."""
    if counted == 0:
        return 0.0, 1.0
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    share = met / counted
    centre = (share + z * z / (2 * counted)) / (1 + z * z / counted)
    spread = z * math.sqrt(share * (1 - share) / counted + z * z / (4 * counted**2))
    spread /= 1 + z * z / counted
    return max(0.0, centre - spread), min(1.0, centre + spread)


@dataclass(frozen=True)
class StopRecord:
    """Why a run stopped: the counted requests, how many had certainly missed, and the best
    attainment still possible with its interval's upper end."""

    at_s: float  # run clock
    counted: int
    missed: int
    delivered: int  # counted requests delivered by then
    best_attainment: float
    best_high: float
    target: float
    confidence: float

    def reason(self) -> str:
        return (
            f"stopped early at {self.at_s:.1f} s: {self.missed} of {self.counted} counted "
            f"requests had certainly missed the SLO, so attainment is at most "
            f"{self.best_attainment:.3f} (interval up to {self.best_high:.3f} at "
            f"{self.confidence:.0%}), below the target {self.target:g}"
        )

    def as_dict(self) -> dict:
        return {**asdict(self), "reason": self.reason()}


class StoppedEarly(Exception):
    """The run ended early (raised out of the replay once the records are written)."""

    def __init__(self, record: StopRecord) -> None:
        super().__init__(record.reason())
        self.record = record


class EarlyStop:
    """`check(now)` once a step: the delivered requests' misses are counted once, when each is
    first seen delivered, so a check walks only the requests not delivered yet."""

    def __init__(self, slo: SLO, confidence: float, requests: Sequence[Request]) -> None:
        self.slo = slo
        self.confidence = confidence
        self.counted = [r for r in requests if not r.excluded]
        self._total = sum(request.sampling.n for request in self.counted)  # samples counted
        self._open = list(self.counted)  # not seen delivered yet
        self._delivered = self._delivered_missed = 0  # samples of those seen delivered

    def check(self, now: float) -> StopRecord | None:
        """The stop's evidence when the verdict can only be a failure by `now`, else None."""
        waiting_missed = 0  # each sample counts as a request, as in the summary
        still_open = []
        for request in self._open:
            if request.t_done is not None:
                self._delivered += request.sampling.n
                self._delivered_missed += sum(
                    not self.slo.meets(request_latency(record)) for record in request.records()
                )
                continue
            still_open.append(request)
            if request.t_send is not None and self._past_a_limit(request, now):
                waiting_missed += request.sampling.n
        self._open = still_open
        counted, missed = self._total, self._delivered_missed + waiting_missed
        best = counted - missed
        high = wilson(best, counted, self.confidence)[1]
        if not counted or high >= self.slo.attainment:
            return None
        return StopRecord(
            now,
            counted,
            missed,
            self._delivered,
            best / counted,
            high,
            self.slo.attainment,
            self.confidence,
        )

    def _past_a_limit(self, request: Request, now: float) -> bool:
        slo, waited = self.slo, now - request.t_scheduled
        most_tokens = request.sampling.max_tokens
        ttft_limit = slo.ttft_limit(request.prompt_len)
        if ttft_limit is not None and not request.token_times and waited > ttft_limit:
            return True
        if slo.e2e_s is not None and waited > slo.e2e_s:
            return True
        if slo.normalized_latency_s is not None and waited / most_tokens > slo.normalized_latency_s:
            return True
        if slo.tpot_s is None or not request.token_times or most_tokens < 2:
            return False
        return (now - request.token_times[0]) / (most_tokens - 1) > slo.tpot_s


def stop_rule(slo: SLO, requests: Sequence[Request]) -> Callable[[float], StopRecord | None]:
    """The run's stop check (`slo.stop_early`): never stops when unset."""
    if slo.stop_early is None:
        return lambda now: None
    return EarlyStop(slo, slo.stop_early, requests).check
