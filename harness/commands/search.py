"""`servelab search`: each strategy's knee, the highest rate it sustains under the SLO, as an
interval found on this machine (`harness.search.knee`).

A rate is sustained by the one SLO rule (`harness.measure.slo`): at least `slo.attainment`
of the requests meet every configured limit, each latency from arrival, failed requests
counted as misses; each probe's verdict carries the attainment's interval
(`harness.measure.verdict`). The time budget (`search.budget_s`; over simulated runs, in the
seconds they simulate) is shared among the strategies (a knee with no clearly passing rate
probed first, the strategy that spent least first, none past an equal share while another's
probe fits in its own, unless it alone has none) and said up front; what it could not
resolve is said at the end. `search.slo_scale` sets the limits from one request at a time on
this machine, before any probe (`harness.search.scaled_slo`: TTFT relative to each prompt's
own prefill), or `search.slo_from` takes an earlier search's limits
(`harness.search.shared_slo`), so a repeat judges against the same SLO; either way the
reference floor runs before the first probe and after the last, and the speed drift between
them widens every fitted knee. Every probe is a full run in its own directory under
`search.out_dir/STRATEGY/` (floor, ceiling, rate-R-nN, rate-R-nN-repeatK for a probe at the
knee on new requests), so the evidence for every answer can be opened, a rerun reuses
complete probes, and `servelab report` draws them. Requests that missed the SLO in every
completed rate probe are named at the end (`harness.search.always_missed`): their length,
not the load, decided those probes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from omegaconf import DictConfig
from rich.console import Console
from rich.table import Table

from servelab.harness.commands.config import compose
from servelab.harness.errors import ConfigError
from servelab.harness.measure.rundir import read_requests
from servelab.harness.measure.slo import LIMITS, SLO
from servelab.harness.measure.verdict import attainment
from servelab.harness.records import RequestRecord
from servelab.harness.runner.backends import backend_of
from servelab.harness.search.always_missed import always_missed, always_missed_line
from servelab.harness.search.attainment_curve import KneeFit
from servelab.harness.search.knee import (
    Knee,
    KneeSettings,
    Outcome,
    Probe,
    find_knees,
    fitted_ratio,
    ratio_interval,
)
from servelab.harness.search.scaled_slo import limits_line, scaled_keys, scaled_limits, speed_drift
from servelab.harness.search.shared_slo import SourceSLO, judged_record, read_source, with_slo

SUMMARY = "each strategy's knee: the highest rate it sustains under the SLO, as an interval"
USAGE = """usage: servelab search [search.strategies=[a,b]] slo.ttft_s=S ... [OVERRIDE ...]

For every strategy: a floor probe (one request at a time), a ceiling probe (every request at
once), then Poisson rates below the ceiling, bisected until the knee is known within
search.resolution, all within search.budget_s; the knee as [highest pass, lowest fail]."""

RunFn = Callable[[DictConfig, Path], dict]
FLOOR_ARRIVAL = ["workload.arrival.process=closed_loop", "workload.arrival.concurrency=1"]


@dataclass(frozen=True)
class SearchSettings:
    strategies: list[str]
    budget_s: float
    confidence: float
    out_dir: Path
    knee: KneeSettings
    slo_scale: dict[str, float]  # limit -> multiple of one request at a time (`scaled_slo`)
    slo_from: SourceSLO | None  # an earlier search's SLO, judged against instead (`shared_slo`)

    @property
    def measures_speed(self) -> bool:
        """Whether the reference floor runs before the first probe and after the last."""
        return bool(self.slo_scale) or self.slo_from is not None

    @classmethod
    def of(cls, cfg: DictConfig) -> SearchSettings:
        node = cfg.search
        scales = (node.get("slo_scale") or {}).items()
        slo_scale = {str(k): v for k, v in scales if v is not None}
        for key, value in slo_scale.items():
            if key not in LIMITS:
                raise ConfigError(f"search.slo_scale.{key}", f"not a limit; one of {LIMITS}")
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ConfigError(f"search.slo_scale.{key}", f"{value!r} must be positive")
        slo = SLO.of_config(cfg)
        given = node.get("slo_from")
        slo_from = None if given is None else read_source(str(given), slo.attainment)
        if not slo.configured and not slo_scale and slo_from is None:
            raise ConfigError(
                "slo", "search needs at least one limit, e.g. slo.ttft_s=2 or slo.tpot_s=0.1"
            )
        strategies = [str(s) for s in node.strategies]
        if not strategies:
            raise ConfigError("search.strategies", "name at least one strategy preset")
        numbers = {key: float(node[key]) for key in ("budget_s", "resolution", "confidence")}
        keys = ("requests", "max_requests", "floor_requests", "ceiling_requests")
        counts = {key: int(node[key]) for key in keys}
        if numbers["budget_s"] <= 0 or numbers["resolution"] <= 0:
            raise ConfigError("search.budget_s", "budget_s and resolution must be positive")
        if not 0 < numbers["confidence"] < 1:
            raise ConfigError("search.confidence", f"{numbers['confidence']} is not in (0, 1)")
        if min(counts.values()) < 1 or counts["max_requests"] < counts["requests"]:
            raise ConfigError(
                "search.requests", "every request count >= 1, and max_requests >= requests"
            )
        knee = KneeSettings(
            target=slo.attainment,
            resolution=numbers["resolution"],
            requests=counts["requests"],
            max_requests=counts["max_requests"],
            floor_requests=counts["floor_requests"],
            ceiling_requests=counts["ceiling_requests"],
            confidence=numbers["confidence"],
            skip_idle=bool(cfg.replay.skip_idle),
        )
        return cls(
            strategies,
            numbers["budget_s"],
            numbers["confidence"],
            Path(str(node.out_dir)),
            knee,
            {key: float(value) for key, value in slo_scale.items()},
            slo_from,
        )


class SimulatedClock:
    """The search's clock over simulated runs: the seconds they simulated (less the idle spans
    a probe skipping them would not wait), so a budget means the same in a simulation as on
    the machine (their wall time is a small part of it)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class RunProber:
    """Probes of one strategy as runs of the composed config, each in its own directory."""

    def __init__(
        self,
        overrides: list[str],
        strategy: str,
        settings: SearchSettings,
        compose: Callable[[list[str]], DictConfig],
        run: RunFn,
        simulated: SimulatedClock | None = None,
    ) -> None:
        self.overrides = [*overrides, f"strategy={strategy}"]
        self.out_dir = settings.out_dir / strategy
        self.confidence = settings.confidence
        self.compose = compose
        self.run = run
        self.simulated = simulated

    def floor(self, requests: int) -> Outcome:
        return self._probe("floor", FLOOR_ARRIVAL, requests)

    def ceiling(self, requests: int) -> Outcome:
        return self._probe("ceiling", ["workload.arrival.process=offline"], requests)

    def at(self, rate: float, requests: int, repeat: int = 0) -> Outcome:
        arrival = ["workload.arrival.process=poisson", f"workload.arrival.rate={rate:.4g}"]
        stop = [f"slo.stop_early={self.confidence}"]  # over saturation, it ends once it must fail
        name = f"rate-{rate:.4g}-n{requests}" + (f"-repeat{repeat}" if repeat else "")
        return self._probe(name, [*arrival, *stop], requests, repeat)

    def reference(
        self, requests: int, name: str = "reference-floor"
    ) -> tuple[dict, list[RequestRecord]]:
        """A floor run's summary and requests: what scaled limits scale (`scaled_slo`), and,
        run again after the last probe, how far the machine's speed moved meanwhile."""
        summary, run_dir, _ = self._run(name, FLOOR_ARRIVAL, requests)
        return summary, read_requests(run_dir)

    def _run(
        self, name: str, arrival: list[str], requests: int, repeat: int = 0
    ) -> tuple[dict, Path, float]:
        cfg = self.compose([*self.overrides, *arrival, f"workload.num_requests={requests}"])
        cfg.workload.seed = int(cfg.workload.seed) + repeat  # a repeat draws other requests
        run_dir = self.out_dir / name
        start = time.monotonic()
        summary = self.run(cfg, run_dir)
        if self.simulated is not None:  # what a real probe waits: skipped spans it does not
            served_s = float(summary.get("duration_s") or 0.0) - idle_skipped_s(summary)
            self.simulated.now += served_s
            return summary, run_dir, served_s
        return summary, run_dir, time.monotonic() - start

    def _probe(self, name: str, arrival: list[str], requests: int, repeat: int = 0) -> Outcome:
        summary, run_dir, seconds = self._run(name, arrival, requests, repeat)
        stopped = summary.get("stopped_early") if summary.get("status") == "stopped" else None
        if stopped is not None:  # the best case still possible when it stopped: a failure
            counted = int(stopped["counted"])
            met = counted - int(stopped["missed"])
        else:
            counted = int(summary.get("completed") or 0) + int(summary.get("failed") or 0)
            share = summary.get("slo_attainment") or 0.0
            met = round(share * counted) if summary.get("status") == "complete" else 0
        measured = attainment(met, counted, self.confidence)
        served_s = float(summary.get("duration_s") or 0.0)
        throughput = summary.get("request_throughput")
        return Outcome(
            str(run_dir),
            measured,
            throughput,
            seconds,
            served_s,
            stopped is not None,
            idle_skipped_s(summary),
        )


def idle_skipped_s(summary: dict) -> float:
    """Of a run's clock, the seconds it skipped with nothing in flight (`replay.skip_idle`)."""
    return float((summary.get("idle_skipped") or {}).get("s") or 0.0)


def search(
    overrides: list[str], compose: Callable[[list[str]], DictConfig], run: RunFn
) -> tuple[list[Knee], SearchSettings]:
    cfg = compose(overrides)
    settings = SearchSettings.of(cfg)
    print(plan_line(settings), flush=True)
    simulated = SimulatedClock() if backend_of(cfg) == "simulated" else None
    clock = simulated or time.monotonic
    deadline = clock() + settings.budget_s
    if settings.slo_from is not None:
        overrides = settings.slo_from.overrides(overrides)
        print(settings.slo_from.line(), flush=True)
    first = RunProber(overrides, settings.strategies[0], settings, compose, run, simulated)
    record: dict = {"settings": _jsonable(asdict(settings))}
    reference: dict = {}
    if settings.measures_speed:
        reference, requests = first.reference(settings.knee.floor_requests)
    if settings.slo_from is not None:
        against = settings.slo_from.speed_against(settings.strategies[0], reference)
        if against is not None:
            print(against.line(), flush=True)
            record["speed_against_slo_source"] = against.to_json()
    elif settings.slo_scale:
        limits = scaled_limits(settings.slo_scale, reference, requests)
        print(limits_line(settings.strategies[0], settings.slo_scale, limits), flush=True)
        unset = {key: "null" for key in sorted(scaled_keys(settings.slo_scale))}
        scaled = {key: f"{value:.4g}" for key, value in limits.items()}
        overrides = with_slo(overrides, {**unset, **scaled})
    record["slo"] = judged_record(SLO.of_config(compose(overrides)))
    probers = {
        s: RunProber(overrides, s, settings, compose, run, simulated) for s in settings.strategies
    }
    left_s = max(deadline - clock(), 0.0)
    knees = find_knees(probers, settings.knee, left_s, clock, seen=print_probe)
    if settings.measures_speed:
        end, _ = first.reference(settings.knee.floor_requests, "reference-floor-end")
        drift = speed_drift(reference, end)
        if drift is not None:
            print(drift.line(), flush=True)
            record["drift"] = drift.to_json()
            for knee in knees:
                knee.fit = None if knee.fit is None else knee.fit.widened(drift.factor)
    record["knees"] = [_jsonable(asdict(k)) for k in knees]
    settings.out_dir.mkdir(parents=True, exist_ok=True)
    (settings.out_dir / "search.json").write_text(json.dumps(record, indent=2))
    return knees, settings


def _jsonable(value: object) -> object:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return str(value) if isinstance(value, Path) else value  # a Verdict is a str already


def probe_line(strategy: str, probe: Probe) -> str:
    """One line for a probe as it ends: what ran, the verdict and its evidence."""
    what = {"floor": "one at a time", "ceiling": "all at once"}.get(probe.kind)
    measured = probe.outcome.attainment
    served = (
        f"at most {measured.met}/{measured.counted} (stopped early)"
        if probe.outcome.stopped
        else f"{measured.met}/{measured.counted}"
    )
    throughput = probe.outcome.request_throughput
    return (
        f"  {strategy}: {what or f'{probe.rate:.3g} req/s'}, {probe.requests} requests: "
        f"{probe.verdict.value}, {served} met the SLO [{measured.low:.2f}, {measured.high:.2f}]"
        + (f", {throughput:.3g} req/s served" if probe.kind == "ceiling" and throughput else "")
        + f" ({probe.outcome.seconds:.0f} s"
        + (
            f", {probe.outcome.idle_skipped_s:.3g} s idle skipped"
            if probe.outcome.idle_skipped_s
            else ""
        )
        + ")"
    )


def print_probe(strategy: str, probe: Probe) -> None:
    print(probe_line(strategy, probe), flush=True)


def plan_line(settings: SearchSettings) -> str:
    knee = settings.knee
    return (
        f"search: {', '.join(settings.strategies)}; {settings.budget_s:.0f} s in all, shared "
        "(each strategy's floor and ceiling first, then each rate probe to a strategy with no "
        "clearly passing rate, the one that spent least first, a probe past its strategy's "
        "equal share waiting while another fits, unless its strategy alone has none); "
        f"{knee.ceiling_requests} requests at once for the ceiling, {knee.requests} a rate "
        f"probe (up to {knee.max_requests} at the knee); the knee within "
        f"{knee.resolution:.0%}; attainment >= {knee.target:g} at "
        f"{settings.confidence:.0%} confidence; probes under {settings.out_dir}"
        + (
            f"; the SLO of {settings.slo_from.path}"
            if settings.slo_from is not None
            else ("; the SLO scaled from a reference floor run" if settings.slo_scale else "")
        )
        + ("; probes skip their idle spans (replay.skip_idle)" if knee.skip_idle else "")
        + (
            "; the reference floor run before the first probe and again after the last (the "
            "machine's speed drift, which widens every fitted knee)"
            if settings.measures_speed
            else ""
        )
    )


def _rate(value: float | None, missing: str) -> str:
    return missing if value is None else f"{value:.3g}"


def fitted_text(knee: Knee) -> str:
    """The fitted knee and its interval, e.g. "0.73 [0.61, 1.03] (3 probes, 192 requests)"."""
    fit = knee.fit
    if fit is None:
        return "-"
    widened = f", widened x{fit.widened_by:.3g} for the speed drift" if fit.widened_by > 1 else ""
    return (
        f"{fit.estimate:.3g} [{_rate(fit.low, '?')}, {_rate(fit.high, '?')}] "
        f"({fit.probes} probes, {fit.requests} requests{widened})"
    )


def needed_text(fit: KneeFit, resolution: float) -> str:
    """What the fitted knee would need to be known within `resolution`, in requests near it
    and in seconds at its rate (the fit's own width: more requests do not narrow a widening
    for the speed drift); '' where a side is open (no such estimate)."""
    requests = fit.requests_for(resolution)
    if requests is None:
        return ""
    more = requests - fit.requests
    own = fit.width / fit.widened_by**2
    widened = f" ({own - 1:.0%} before its widening for the speed drift)" if own < fit.width else ""
    return (
        f"fitted within {fit.width - 1:.0%}{widened}; {resolution:.0%} needs about {more} more "
        f"requests near {fit.estimate:.3g} req/s (~{more / fit.estimate:.0f} s)"
    )


def render_search(knees: list[Knee], resolution: float) -> str:
    table = Table(
        title="sustained request rate (req/s): the knee lies in [passed, failed), or below the "
        "ceiling where no rate clearly failed"
    )
    columns = ("strategy", "ceiling", "passed", "failed", "estimate", "fitted knee", "probes")
    for column in (*columns, "note"):
        table.add_column(column)
    for knee in knees:
        unresolved_fit = None if knee.resolved else knee.fit
        needed = "" if unresolved_fit is None else needed_text(unresolved_fit, resolution)
        probes = ", ".join(
            f"{p.kind if p.rate is None else f'{p.rate:.3g}'}:{p.verdict.value}"
            f"({'stopped, at most ' if p.outcome.stopped else ''}"
            f"{p.outcome.attainment.met}/{p.outcome.attainment.counted})"
            for p in knee.probes
        )
        table.add_row(
            knee.strategy,
            _rate(knee.ceiling, "-"),
            _rate(knee.passed, "none"),
            _rate(knee.failed, "none"),
            _rate(knee.estimate, "-"),
            fitted_text(knee),
            probes,
            "; ".join(filter(None, [knee.note or ("resolved" if knee.resolved else ""), needed])),
        )
    ratios = Table(
        title="sustained-rate ratios, as intervals: from the clear verdicts, and from "
        "the fitted knees"
    )
    for column in ("ratio", "lowest", "highest", "fitted lowest", "fitted highest"):
        ratios.add_column(column)
    for i, first in enumerate(knees):
        for second in knees[:i]:
            a, b = sorted((first, second), key=lambda k: k.estimate or 0.0, reverse=True)
            low, high = ratio_interval(a, b)
            fit_low, fit_high = fitted_ratio(a, b)
            ratios.add_row(
                f"{a.strategy} / {b.strategy}",
                *(_rate(value, "-") for value in (low, high, fit_low, fit_high)),
            )
    console = Console(record=True, width=160)
    with console.capture() as capture:
        console.print(table)
        console.print(ratios)
    return capture.get()


def main(args: list[str]) -> None:
    from servelab.harness.runner.run import completed_summary, run

    def run_or_reuse(cfg: DictConfig, run_dir: Path) -> dict:
        return completed_summary(cfg, run_dir) or run(cfg, run_dir, progress=False)

    knees, settings = search(args, compose, run_or_reuse)
    print(render_search(knees, settings.knee.resolution))
    completed = [
        (p.rate, Path(p.outcome.run_dir))
        for k in knees
        for p in k.probes
        if p.rate is not None and not p.outcome.stopped
    ]
    missed = always_missed_line(always_missed(completed))
    if missed:
        print(missed)
    unresolved = [k.strategy for k in knees if not k.resolved]
    if unresolved:
        print(f"not resolved within the budget: {', '.join(unresolved)} (raise search.budget_s)")
    print(f"probes and search.json under {settings.out_dir}")
