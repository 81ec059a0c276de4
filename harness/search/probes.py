"""A search's probes as runs: a typed probe (`ProbeSpec`) set on the strategy's composed
config, run in its own directory, and read back as every request's SLO ratio (`Outcome`).

The config is composed once per strategy, its SLO set (`slo.earlier_run.with_slo`); each probe is
a copy with its arrivals, request count and seed set, so no probe composes Hydra overrides
again. Each probe's directory (`out_dir/STRATEGY/NAME`) keeps its evidence: a rerun reuses
a complete one, and `servelab report` draws them.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from omegaconf import DictConfig, open_dict

from servelab.base.records import RequestRecord
from servelab.harness.measure.rundir import read_requests
from servelab.harness.measure.slo.limits import SLO
from servelab.harness.run.schema import checked
from servelab.harness.search.probe_ratios import ProbeQuantile, ProbeRatios, probe_ratios

RunFn = Callable[[DictConfig, Path], dict]  # (config, run directory) -> summary
Kind = Literal["floor", "ceiling", "rate"]


@dataclass(frozen=True)
class ProbeSpec:
    """One probe as the search asks for it: how the requests arrive, how many, which draw."""

    kind: Kind  # floor: one at a time; ceiling: all at once; rate: Poisson at `rate`
    requests: int  # the warm-up's included
    rate: float | None = None  # req/s, rate probes only
    draw: int = 0  # the workload drawn with its seed moved by this: each rate probe its own
    warmup: int = 0  # the first requests (in arrival order) served but left out of its quantile
    sized_by: str = ""  # what set its length: "precision" or "span" (rate probes)

    @property
    def name(self) -> str:
        """Its run directory's name under the strategy's."""
        if self.kind != "rate":
            return self.kind
        return f"rate-{self.rate:.4g}-n{self.requests}" + (f"-draw{self.draw}" if self.draw else "")


@dataclass(frozen=True)
class Outcome:
    """What one probe's run measured: every request's SLO ratio, and what it cost."""

    run_dir: str
    ratios: ProbeRatios  # its rate is the probe's (None for the floor and ceiling)
    request_throughput: float | None
    seconds: float  # what the probe took on the search's clock
    served_s: float  # the run's own duration (first arrival to last response)
    stopped: bool = False  # ended early, over saturation: its unserved requests are censored
    idle_skipped_s: float = 0.0  # of the run's clock, skipped with nothing in flight
    cache_nonce: int | None = None  # its prompts made new to a server's cache by this nonce
    warm_cache_share: float | None = None  # of its prompt tokens, found in a cache it did not fill


@dataclass(frozen=True)
class Probe:
    """A probe that ran: what was asked, what it measured, its ratio quantile and interval."""

    spec: ProbeSpec
    outcome: Outcome
    quantile: ProbeQuantile


class Prober(Protocol):
    """Runs one strategy's probes, a run each (`RunProber`)."""

    skips_idle: bool  # its probes skip their idle spans (`replay.skip_idle`)

    def run(self, spec: ProbeSpec) -> Outcome:
        """The probe's outcome; `ProberGone` where what serves the strategy is gone."""
        ...

    def done(self) -> None:
        """The strategy's last probe has run: what serves it may stop."""
        ...


class ProberGone(RuntimeError):
    """What serves a strategy is gone (its server exited or never answered): one line; the
    strategy's search ends with the probes it ran, the others go on."""


class SimulatedClock:
    """The search's clock over simulated runs: the seconds they simulated (less the idle spans
    a probe skipping them would not wait), so a budget means the same in a simulation as on
    the machine (their wall time is a small part of it)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def probe_config(cfg: DictConfig, spec: ProbeSpec, stop_early: float | None) -> DictConfig:
    """A copy of `cfg` that runs `spec`: its arrivals, its requests, its draw of the workload;
    a rate probe stops as soon as it can only miss (`slo.stop_early` at `stop_early`; None:
    served to the end)."""
    probe = copy.deepcopy(cfg)
    workload = probe.workload
    with open_dict(workload):
        if spec.kind == "floor":
            workload.arrival.process, workload.arrival.concurrency = "closed_loop", 1
        elif spec.kind == "ceiling":
            workload.arrival.process = "offline"
        else:
            workload.arrival.process, workload.arrival.rate = "poisson", spec.rate
            probe.slo.stop_early = stop_early
        workload.num_requests = spec.requests
        workload.seed = int(workload.seed) + spec.draw
        if spec.warmup:
            workload.warmup.requests, workload.warmup.seconds = spec.warmup, 0.0
    return probe


def idle_skipped_s(summary: dict) -> float:
    """Of a run's clock, the seconds it skipped with nothing in flight (`replay.skip_idle`)."""
    return float((summary.get("idle_skipped") or {}).get("s") or 0.0)


REFERENCE = "reference-floor"  # the first strategy's floor run before the first probe


class RunProber:
    """One strategy's probes as runs of its config, each in `out_dir/NAME`."""

    def __init__(
        self,
        cfg: DictConfig,
        out_dir: Path,
        stop_early: float | None,
        run: RunFn,
        simulated: SimulatedClock | None = None,
    ) -> None:
        self.out_dir, self.stop_early = out_dir, stop_early
        self.execute, self.simulated = run, simulated
        self.judge_by(cfg)
        self.skips_idle = checked(cfg.replay, "replay.skip_idle")

    def judge_by(self, cfg: DictConfig) -> None:
        """Run `cfg` from now on, its requests judged by its SLO (set once scaled)."""
        self.cfg, self.slo = cfg, SLO.of_config(cfg)

    def run(self, spec: ProbeSpec) -> Outcome:
        cfg = self.config(spec)
        summary, run_dir, seconds = self._run(cfg, spec.name)
        stopped = summary.get("status") == "stopped"
        return Outcome(
            str(run_dir),
            probe_ratios(spec.rate, read_requests(run_dir), self.slo),
            summary.get("request_throughput"),
            seconds,
            float(summary.get("duration_s") or 0.0),
            stopped,
            idle_skipped_s(summary),
            cfg.workload.get("cache_bust"),
            summary.get("warm_cache_share"),
        )

    def done(self) -> None:
        """Nothing to stop: each probe's engine is its run's own."""

    def config(self, spec: ProbeSpec) -> DictConfig:
        """The config of the run that is the probe `spec`."""
        return probe_config(self.cfg, spec, self.stop_early)

    def reference(self, requests: int, name: str = REFERENCE) -> tuple[dict, list[RequestRecord]]:
        """A floor run's summary and requests: what scaled limits scale (`slo.scaled`), and,
        run again after the last probe, how far the machine's speed moved meanwhile."""
        summary, run_dir, _ = self._run(self.config(ProbeSpec("floor", requests)), name)
        return summary, read_requests(run_dir)

    def _run(self, cfg: DictConfig, name: str) -> tuple[dict, Path, float]:
        """The run of `cfg` in `out_dir/name`: its summary, directory and seconds on the
        search's clock."""
        run_dir = self.out_dir / name
        start = time.monotonic()
        summary = self.execute(cfg, run_dir)
        if self.simulated is not None:  # what a real probe waits: skipped spans it does not
            served_s = float(summary.get("duration_s") or 0.0) - idle_skipped_s(summary)
            self.simulated.now += served_s
            return summary, run_dir, served_s
        return summary, run_dir, time.monotonic() - start
