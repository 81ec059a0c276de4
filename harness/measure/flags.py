"""What makes a run's figures doubtful: the one set of rules the summary, the reports and the
gates use, each with its bound stated here.

A flag is a code and one line of text. `summary.json` keeps the lines in `flags` (what
reports show) and the codes in `flag_codes`; gates refuse a run with any code in `REFUSED`:

- `failed_requests`: a counted request failed, was rejected or was cancelled.
- `send_lag`: the client handed requests over late, p99 above `SEND_LAG_BOUND_S`.
- `arrivals_off`: the gaps between the client's sends, at the load generator's resolution
  (`load_generator.LATE_S`) and beyond, do not follow the configured process (its
  Kolmogorov-Smirnov p-value below `ARRIVALS_P_BOUND`): the server saw other arrivals than
  the ones configured.
- `preemption_storm`: more than `STORM_PREEMPTIONS_PER_REQUEST` preemptions per completed
  request (and at least `STORM_MIN_PREEMPTIONS`): the engine spent the run evicting and
  recomputing, so its figures measure thrashing, not the strategy.
- `telemetry_dropout`: records the run should have and does not: step numbers missing from
  `steps.jsonl`; a gap between two steps, while requests were left running or waiting after
  the first of them (a step's `running` counts the requests it finishes, so those it
  delivered come off), longer than
  `DROPOUT_MIN_GAP_S` and `DROPOUT_STEP_FACTOR` times the p99 step (the loop stalled, or
  steps went unrecorded); or a gap in `telemetry.csv`, over the time requests were in flight,
  longer than `DROPOUT_MIN_GAP_S` and `DROPOUT_SAMPLE_FACTOR` sampling periods.
- `incomplete`: the run stopped before writing its own summary (rebuilt from its records).
- `warm_prefix_cache`: more than `WARM_CACHE_BOUND` of the prompt tokens were served from a
  prefix cache the run did not fill (`prompt_cache`: an earlier run's, on a server that
  outlived it): its TTFT and prefill figures measure warm prompts, not the workload's.

Four codes say something without refusing the run: `test_step_delay` (the test-only knob
slowed every step on purpose, which is how a gate is shown to fail on its ratios),
`peaks_beaten` (steps beat the calibrated peaks, so MFU and MBU read high), `estimated`
(a peer server did not report its token counts or times, so they were estimated) and
`busy_machine` (while requests were in flight, other processes, or on a VM other guests,
used more than `BUSY_OTHERS_PCT` percent of a core on average: a run served in this process
shared the machine, and its speed reads low; gates interleave their runs, so it does not
refuse one). One more
refuses it: `simulated` (`backend=simulated`: every step's duration was predicted by a
step-cost model, so the run measured nothing).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from servelab.base.records import RequestRecord, StepRecord

SEND_LAG_BOUND_S = 0.05
ARRIVALS_P_BOUND = 0.001  # one run in a thousand sending the configured process is flagged
STORM_PREEMPTIONS_PER_REQUEST = 1.0
STORM_MIN_PREEMPTIONS = 10
DROPOUT_MIN_GAP_S = 1.0
DROPOUT_STEP_FACTOR = 20.0
DROPOUT_SAMPLE_FACTOR = 40.0

FAILED_REQUESTS = "failed_requests"
SEND_LAG = "send_lag"
ARRIVALS_OFF = "arrivals_off"
PREEMPTION_STORM = "preemption_storm"
TELEMETRY_DROPOUT = "telemetry_dropout"
INCOMPLETE = "incomplete"
TEST_STEP_DELAY = "test_step_delay"
PEAKS_BEATEN = "peaks_beaten"
ESTIMATED = "estimated"
SIMULATED = "simulated"
BUSY_MACHINE = "busy_machine"
WARM_PREFIX_CACHE = "warm_prefix_cache"
WARM_CACHE_BOUND = 0.1  # of the prompt tokens, served from a cache the run did not fill
BUSY_OTHERS_PCT = 50.0  # percent of one core
OTHERS_CPU = "others_cpu_pct"  # telemetry.csv's column of the CPU other processes used
REFUSED = frozenset(
    {
        FAILED_REQUESTS,
        SEND_LAG,
        ARRIVALS_OFF,
        PREEMPTION_STORM,
        TELEMETRY_DROPOUT,
        INCOMPLETE,
        SIMULATED,
        WARM_PREFIX_CACHE,
    }
)


@dataclass(frozen=True)
class Flag:
    code: str
    text: str


def summary_flags(summary: dict) -> list[Flag]:
    """Flags the summary's own figures raise: failed requests, send lag, arrivals off the
    configured process, a warm prefix cache, preemption storm."""
    flags = []
    if summary.get("failed"):
        flags.append(Flag(FAILED_REQUESTS, f"{summary['failed']} requests failed or were rejected"))
    lag = (summary.get("send_lag") or {}).get("p99")
    if lag is not None and lag > SEND_LAG_BOUND_S:
        text = f"client send lag p99 {lag * 1000:.1f} ms > {SEND_LAG_BOUND_S * 1000:g} ms"
        flags.append(Flag(SEND_LAG, text))
    p_value = (summary.get("load_generator") or {}).get("ks_p_value")
    if p_value is not None and p_value < ARRIVALS_P_BOUND:
        text = (
            f"the client's send gaps do not follow the configured "
            f"{summary['load_generator'].get('process')} arrivals (KS p = {p_value:.2g})"
        )
        flags.append(Flag(ARRIVALS_OFF, text))
    warm = summary.get("warm_cache_share")
    if warm is not None and warm > WARM_CACHE_BOUND:
        text = (
            f"{warm:.0%} of the prompt tokens were served from a prefix cache this run did not "
            "fill (an earlier run's): TTFT and prefill throughput measure warm prompts; repeat "
            "with workload.cache_bust=true to measure cold ones"
        )
        flags.append(Flag(WARM_PREFIX_CACHE, text))
    preemptions = summary.get("preemptions") or 0
    completed = summary.get("completed") or 0
    per_request = preemptions / max(completed, 1)
    if preemptions >= STORM_MIN_PREEMPTIONS and per_request > STORM_PREEMPTIONS_PER_REQUEST:
        flags.append(
            Flag(
                PREEMPTION_STORM,
                f"preemption storm: {preemptions} preemptions for {completed} completed "
                f"requests ({per_request:.1f} each > {STORM_PREEMPTIONS_PER_REQUEST:g})",
            )
        )
    return flags


def _queued_after(step: StepRecord) -> bool:
    """Whether work was left when the step ended: its running requests less the responses it
    delivered (static batching delivers a whole batch at its end, held members included), plus
    the waiting ones."""
    return max(0, step.running - step.delivered) + step.waiting > 0


def step_dropouts(steps: Sequence[StepRecord]) -> list[Flag]:
    """Missing step numbers, and stalls between steps while work was queued."""
    if not steps:
        return []
    flags = []
    numbers = sorted(s.step for s in steps)
    missing = numbers[-1] - numbers[0] + 1 - len(set(numbers))
    if missing:
        flags.append(Flag(TELEMETRY_DROPOUT, f"{missing} step records missing from steps.jsonl"))
    durations = [s.t_end - s.t_start for s in steps]
    bound = max(DROPOUT_MIN_GAP_S, DROPOUT_STEP_FACTOR * float(np.percentile(durations, 99)))
    ordered = sorted(steps, key=lambda s: s.t_start)
    stalls = [
        after.t_start - before.t_end
        for before, after in zip(ordered, ordered[1:], strict=False)
        if after.t_start - before.t_end > bound and _queued_after(before)
    ]
    if stalls:
        flags.append(
            Flag(
                TELEMETRY_DROPOUT,
                f"{len(stalls)} gap(s) between steps with work queued, longest "
                f"{max(stalls):.2f} s > {bound:.2f} s (no step recorded meanwhile)",
            )
        )
    return flags


def in_flight_spans(requests: Sequence[RequestRecord]) -> list[tuple[float, float]]:
    """The spans in which some request was in flight (arrived, not yet delivered), merged, in
    order; a request with no end recorded is in flight from its arrival on."""
    spans = sorted(
        (
            r.t_scheduled,
            r.t_done if r.t_done is not None else (r.token_times or [math.inf])[-1],
        )
        for r in requests
    )
    merged: list[tuple[float, float]] = []
    for begin, end in spans:
        if merged and begin <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((begin, end))
    return merged


def _overlap(begin: float, end: float, spans: Sequence[tuple[float, float]]) -> float:
    return sum(max(0.0, min(end, b) - max(begin, a)) for a, b in spans)


def telemetry_dropouts(
    path: Path, period_s: float, in_flight: Sequence[tuple[float, float]]
) -> list[Flag]:
    """Gaps in telemetry.csv far beyond its sampling period, counted over the time requests
    were in flight: with none in flight there was nothing to measure (and a replay that skips
    idle spans, `replay.skip_idle`, jumps its clock over them, samples and all)."""
    if not path.is_file():
        return []
    with path.open(newline="") as handle:
        times = []
        for row in csv.DictReader(handle):
            try:
                times.append(float(row["t"]))
            except (KeyError, TypeError, ValueError):
                continue
    bound = max(DROPOUT_MIN_GAP_S, DROPOUT_SAMPLE_FACTOR * period_s)
    gaps = [_overlap(a, b, in_flight) for a, b in zip(times, times[1:], strict=False)]
    gaps = [gap for gap in gaps if gap > bound]
    if not gaps:
        return []
    return [
        Flag(
            TELEMETRY_DROPOUT,
            f"{len(gaps)} gap(s) in telemetry.csv while requests were in flight, longest "
            f"{max(gaps):.2f} s > {bound:.2f} s",
        )
    ]


def busy_machine(path: Path, in_flight: Sequence[tuple[float, float]]) -> list[Flag]:
    """Other processes' CPU (telemetry.csv's `others_cpu_pct`, each row the share since the
    row before) averaged over the time requests were in flight, flagged past the bound."""
    if not path.is_file():
        return []
    weighted = spent = 0.0
    with path.open(newline="") as handle:
        before = None
        for row in csv.DictReader(handle):
            try:
                t, share = float(row["t"]), float(row[OTHERS_CPU])
            except (KeyError, TypeError, ValueError):
                continue
            if before is not None:
                overlap = _overlap(before, t, in_flight)
                weighted, spent = weighted + share * overlap, spent + overlap
            before = t
    if spent <= 0 or weighted / spent <= BUSY_OTHERS_PCT:
        return []
    return [
        Flag(
            BUSY_MACHINE,
            f"other processes used {weighted / spent:.0f}% of a core on average while "
            f"requests were in flight (> {BUSY_OTHERS_PCT:.0f}%): the run shared the machine, "
            "its speed reads low",
        )
    ]


def add_flags(summary: dict, flags: Sequence[Flag]) -> None:
    """Add `flags` to the summary's `flags` (lines) and `flag_codes`, each once, in order."""
    lines: list[str] = summary.get("flags") or []
    codes: list[str] = summary.get("flag_codes") or []
    for flag in flags:
        if flag.text not in lines:
            lines.append(flag.text)
        if flag.code not in codes:
            codes.append(flag.code)
    summary["flags"] = lines
    summary["flag_codes"] = codes


def refusals(summary: dict) -> list[str]:
    """Why a gate must not use this run (empty: it may)."""
    codes = set(summary.get("flag_codes") or [])
    if summary.get("status") not in (None, "complete"):
        codes.add(INCOMPLETE)
    if not codes & REFUSED:
        return []
    return list(summary.get("flags") or []) or sorted(codes & REFUSED)
