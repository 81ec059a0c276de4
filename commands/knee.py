"""`servelab knee DIR...`: each strategy's knee from rate runs already on disk, by the SLO
ratios' quantile (`harness/search/estimator.py`), with its interval, the ratio of every pair
of strategies and where one more probe narrows each interval most; as lines and as JSON."""

from __future__ import annotations

import argparse
import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path

import yaml

from servelab.base.errors import ConfigError
from servelab.harness.measure.rundir import REQUESTS, read_requests
from servelab.harness.measure.slo.limits import SLO
from servelab.harness.search.estimator import Knee, fit_knee, knee_ratio
from servelab.harness.search.policy import next_rate
from servelab.harness.search.probe_ratios import probe_ratios
from servelab.harness.search.text import knee_text, rate_text

SUMMARY = "each strategy's knee from rate runs on disk, read off every request's SLO ratio"
USAGE = """usage: servelab knee DIR [DIR ...] [--slo KEY=SECONDS ...] [--attainment SHARE]
                     [--confidence C] [--warmup SHARE] [--json FILE]

Each DIR is a run directory, or a folder searched for them (a search's out_dir). Runs at a
Poisson or gamma rate are grouped by strategy, workload, model and backend (named where it is
not the engine in this process: a search's simulated prediction); each group gives one knee:
the highest rate at which the SHARE-quantile (default: the SLO's attainment, 0.9) of its
requests' SLO ratios (the largest of metric / limit) is at most 1, fitted monotone across
rates, with its C interval (default 0.95). The SLO is the one the runs recorded (one for all)
unless --slo gives limits (slo keys: ttft_s, ttft_per_prompt_token_s, tpot_s, e2e_s,
normalized_latency_s). --warmup leaves out each run's first share of requests. Prints a line
per knee, the ratio of every pair and where one more probe narrows each interval most;
--json FILE writes the same."""


@dataclass(frozen=True)
class RateRun:
    """One rate run on disk: what it served, at which rate, against which SLO."""

    path: Path
    group: tuple[str, ...]  # strategy, workload, model, and the backend unless in process
    rate: float
    slo: SLO | None


def main(args: list[str]) -> None:
    options = parse(args)
    runs = [run for path in options.dirs for run in rate_runs(Path(path))]
    if not runs:
        raise ConfigError(
            "knee",
            f"no rate run (requests.jsonl at a Poisson or gamma rate) in {' '.join(options.dirs)}",
        )
    slo = options_slo(options.slo, runs)
    share = options.attainment or slo.attainment
    knees: dict[str, Knee] = {}
    for group, members in itertools.groupby(
        sorted(runs, key=lambda r: r.group), key=lambda r: r.group
    ):
        probes = [probe_ratios(run.rate, read_requests(run.path), slo) for run in members]
        knees["/".join(group)] = fit_knee(probes, share, options.confidence, options.warmup)
    lines, payload = describe(knees, slo, share, options.confidence)
    for line in lines:
        print(line)
    if options.json:
        Path(options.json).write_text(json.dumps(payload, indent=1) + "\n")


def parse(args: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="servelab knee", add_help=False)
    parser.add_argument("dirs", nargs="*")
    parser.add_argument("--slo", nargs="+", default=[])
    parser.add_argument("--attainment", type=float, default=None)
    parser.add_argument("--confidence", type=float, default=0.95)
    parser.add_argument("--warmup", type=float, default=0.0)
    parser.add_argument("--json", default=None)
    options, unknown = parser.parse_known_args(args)
    if unknown or not options.dirs:
        raise ConfigError("knee", f"{' '.join(unknown) or 'no DIR given'}; {USAGE.splitlines()[0]}")
    for name, value in (("confidence", options.confidence), ("warmup", options.warmup)):
        if not 0 <= value < 1 or (name == "confidence" and value == 0):
            raise ConfigError(f"knee.{name}", f"{value} must be a share in (0, 1)")
    if options.attainment is not None and not 0 < options.attainment < 1:
        raise ConfigError("knee.attainment", f"{options.attainment} must be a share in (0, 1)")
    for path in options.dirs:
        if not Path(path).is_dir():
            raise ConfigError("knee", f"{path} is not a directory")
    return options


def rate_runs(root: Path) -> list[RateRun]:
    """The rate runs at or below `root`."""
    found = []
    for requests in sorted(root.rglob(REQUESTS)):
        run_dir = requests.parent
        config_path = run_dir / "config.yaml"
        if not config_path.exists():
            continue
        config = yaml.safe_load(config_path.read_text())
        arrival = (config.get("workload") or {}).get("arrival") or {}
        rate = arrival.get("rate")
        if arrival.get("process") not in ("poisson", "gamma") or not rate:
            continue
        backend = str(config.get("backend") or "inprocess")
        group = (
            str((config.get("strategy") or {}).get("name")),
            str((config.get("workload") or {}).get("name")),
            str((config.get("model") or {}).get("name")),
            *([] if backend == "inprocess" else [backend]),  # a search's prediction apart
        )
        found.append(RateRun(run_dir, group, float(rate), SLO.of_record(config.get("slo"))))
    return found


def options_slo(given: list[str], runs: list[RateRun]) -> SLO:
    """The SLO of --slo, else the one every run recorded."""
    if given:
        pairs = [item.split("=", 1) for item in given]
        if any(len(pair) != 2 for pair in pairs):
            raise ConfigError("knee.slo", f"{' '.join(given)}: give KEY=SECONDS, e.g. ttft_s=0.5")
        try:
            slo = SLO.from_config({key: float(value) for key, value in pairs})
        except ValueError as error:
            raise ConfigError("knee.slo", str(error)) from None
    else:
        recorded = {run.slo for run in runs}
        if len(recorded) != 1 or None in recorded:
            raise ConfigError(
                "knee.slo",
                f"the runs recorded {len(recorded)} different SLOs; give one with --slo",
            )
        (slo,) = recorded
        assert slo is not None
    if not slo.configured:
        raise ConfigError("knee.slo", "no limit to judge against; give one with --slo ttft_s=...")
    return slo


def describe(
    knees: dict[str, Knee], slo: SLO, share: float, confidence: float
) -> tuple[list[str], dict[str, object]]:
    """The lines printed and the JSON written."""
    lines = [slo.describe(), f"knee: where the {share:g}-quantile of the requests' SLO ratios "
             f"(the largest of metric / limit) crosses 1; {confidence:.0%} intervals"]  # fmt: skip
    entries: dict[str, dict[str, object]] = {}
    for name, knee in knees.items():
        advice = next_rate(knee)
        lines.append(
            f"{name}: {knee_text(knee)}; {len(knee.probes)} rates, "
            f"{sum(q.requests for q in knee.probes)} requests; next probe at "
            f"{rate_text(advice)} req/s"
        )
        entries[name] = {
            "estimate": knee.estimate, "low": knee.low, "high": knee.high, "cliff": knee.cliff,
            "below": knee.below, "above": knee.above, "next_rate": advice,
            "rates": [
                {"rate": q.rate, "quantile": q.quantile, "known": q.known, "low": q.low,
                 "high": _finite(q.high), "requests": q.requests, "over_capacity": q.over_capacity}
                for q in knee.probes
            ],
        }  # fmt: skip
    ratios = []
    for top, bottom in itertools.permutations(knees, 2):
        ratio = knee_ratio(knees[top], knees[bottom])
        if (knees[top].centre or 0.0) >= (knees[bottom].centre or 0.0):  # each pair once
            lines.append(f"{top} / {bottom}: {rate_text(ratio.estimate)} "
                         f"[{rate_text(ratio.low)}, {rate_text(ratio.high)}]")  # fmt: skip
        ratios.append({"top": top, "bottom": bottom, "estimate": ratio.estimate,
                       "low": ratio.low, "high": ratio.high})  # fmt: skip
    payload = {
        "slo": {key: getattr(slo, key) for key in ("ttft_s", "ttft_per_prompt_token_s",
                                                    "tpot_s", "e2e_s", "normalized_latency_s")},
        "share": share, "confidence": confidence, "knees": entries, "ratios": ratios,
    }  # fmt: skip
    return lines, payload


def _finite(value: float) -> float | None:
    return None if math.isinf(value) else value
