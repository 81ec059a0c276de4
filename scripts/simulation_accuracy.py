"""Simulated against measured, on configurations the step-cost model was not fitted on.

Usage: python scripts/simulation_accuracy.py SEARCH_DIR (--fit STRATEGY [...] | --cost-model
       FILE) [--out DIR] [--knees]

SEARCH_DIR is one `servelab search` (`make run` writes one under runs/comparison/): its
probes are real runs of several strategies at several loads, all of one model, dtype and
device. The step-cost model is fitted on every probe of the `--fit` strategies (stopped ones
too: their steps are whole), or given (`--cost-model`, e.g. from `servelab profile-steps`,
which holds every strategy out); every other strategy's complete probe (held out) is run again
as `backend=simulated` from its own `config.yaml`, and its TTFT p50/p99, TPOT p50/p99 and
output throughput are set beside the measured ones; each held-out rate probe is also
simulated as it was probed (stopping early as it did) and its SLO outcome set beside the
measured one. `--knees` also runs the whole search simulated, under the real search's
absolute SLO limits, and sets each strategy's simulated knee (estimate and interval)
beside the measured one. Writes accuracy.json (and the simulated runs) under --out; prints
the tables and the median absolute error of each metric.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from functools import partial
from pathlib import Path

from omegaconf import OmegaConf

from servelab.commands.fit_steps import main as fit_steps
from servelab.harness.run.compose import compose
from servelab.harness.run.run import run
from servelab.harness.search.knee_search import search
from servelab.reports.run_report import reported

METRICS = {
    "ttft p50": ("ttft", "p50"),
    "ttft p99": ("ttft", "p99"),
    "tpot p50": ("tpot", "p50"),
    "tpot p99": ("tpot", "p99"),
    "output tok/s": ("output_throughput", None),
}

run_reported = reported(partial(run, progress=False))  # each run and its report


def probes(search_dir: Path, strategy: str, complete: bool = True) -> list[Path]:
    """The strategy's probe directories; with `complete`, only those whose run ended by
    itself (a stopped one's latencies are partial; its steps still fit)."""
    found = []
    for summary in sorted((search_dir / strategy).glob("*/summary.json")):
        status = json.loads(summary.read_text()).get("status")
        if status == "complete" or (not complete and status == "stopped"):
            found.append(summary.parent)
    return found


def metric(summary: dict, key: str, part: str | None) -> float | None:
    value = summary.get(key)
    if part is not None:
        value = (value or {}).get(part)
    return float(value) if isinstance(value, int | float) else None


def simulate_probe(probe: Path, cost: Path, out: Path) -> dict:
    cfg = OmegaConf.load(probe / "config.yaml")
    cfg.backend = "simulated"
    cfg.simulate = {"cost_model": str(cost)}
    cfg.slo.stop_early = None  # the measured probe ran to its end: so does its twin
    return run_reported(cfg, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("search_dir", type=Path)
    given = parser.add_mutually_exclusive_group(required=True)
    given.add_argument("--fit", nargs="+", help="strategies to fit on")
    given.add_argument(
        "--cost-model", type=Path, help="a model fitted elsewhere (profile-steps): all held out"
    )
    parser.add_argument("--out", type=Path, default=Path("runs/simulation-accuracy"))
    parser.add_argument("--knees", action="store_true", help="also search simulated")
    args = parser.parse_args()
    search_record = json.loads((args.search_dir / "search.json").read_text())
    strategies = list(search_record["settings"]["strategies"])
    fit = args.fit or []
    held_out = [s for s in strategies if s not in fit]
    fitted_on = [p for s in fit for p in probes(args.search_dir, s, complete=False)]
    cost = args.cost_model or args.out / "cost.json"
    start = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    if fitted_on:
        fit_steps([*map(str, fitted_on), "--out", str(cost)])
    rows = []
    for strategy in held_out:
        for probe in probes(args.search_dir, strategy):
            if probe.name == "reference-floor":
                continue
            measured = json.loads((probe / "summary.json").read_text())
            simulated = simulate_probe(probe, cost, args.out / strategy / probe.name)
            row = {"strategy": strategy, "probe": probe.name}
            for name, (key, part) in METRICS.items():
                real, predicted = metric(measured, key, part), metric(simulated, key, part)
                row[name] = [real, predicted]
            rows.append(row)
            print(line(row), flush=True)
    verdicts = []
    for strategy in held_out:
        for probe in probes(args.search_dir, strategy, complete=False):
            if not probe.name.startswith("rate-"):
                continue
            measured = json.loads((probe / "summary.json").read_text())
            cfg = OmegaConf.load(probe / "config.yaml")
            cfg.backend, cfg.simulate = "simulated", {"cost_model": str(cost)}
            simulated = run_reported(cfg, args.out / strategy / f"{probe.name}-as-probed")
            outcomes = {"measured": attainment_of(measured), "simulated": attainment_of(simulated)}
            verdicts.append({"strategy": strategy, "probe": probe.name, **outcomes})
            print(f"{strategy:>18} {probe.name:<18} measured {verdicts[-1]['measured']}, "
                  f"simulated {verdicts[-1]['simulated']}", flush=True)  # fmt: skip
    errors = {
        name: statistics.median(abs(p / r - 1) for r, p in (row[name] for row in rows) if r and p)
        for name in METRICS
        if any(row[name][0] and row[name][1] for row in rows)
    }
    print(
        "median |simulated / measured - 1|: " + ", ".join(f"{k} {v:.1%}" for k, v in errors.items())
    )
    record: dict = {"fitted_on": [str(p) for p in fitted_on] or str(cost), "held_out": held_out,
                    "rows": rows,
                    "verdicts": verdicts, "median_errors": errors,
                    "simulate_s": time.perf_counter() - start}  # fmt: skip
    if args.knees:
        record["knees"] = simulated_knees(args.search_dir, search_record, cost, args.out)
    (args.out / "accuracy.json").write_text(json.dumps(record, indent=2))


def attainment_of(summary: dict) -> str:
    """A probe's outcome as the search reads it: met / counted, or the best case if stopped."""
    stopped = summary.get("stopped_early")
    if summary.get("status") == "stopped" and stopped:
        return f"stopped, at most {stopped['counted'] - stopped['missed']}/{stopped['counted']}"
    counted = int(summary.get("completed") or 0) + int(summary.get("failed") or 0)
    return f"{round((summary.get('slo_attainment') or 0) * counted)}/{counted}"


def line(row: dict) -> str:
    cells = [f"{row['strategy']:>18} {row['probe']:<18}"]
    for name in METRICS:
        real, predicted = row[name]
        if real and predicted:
            cells.append(f"{name} {real:.3g}/{predicted:.3g} ({predicted / real - 1:+.0%})")
    return "  ".join(cells)


def simulated_knees(search_dir: Path, record: dict, cost: Path, out: Path) -> list[dict]:
    """The search again, every probe simulated, under the real search's absolute limits
    (read from its floor probe) and settings; each knee beside the measured one."""
    strategies = list(record["settings"]["strategies"])
    floor_cfg = OmegaConf.load(search_dir / strategies[0] / "floor" / "config.yaml")
    limits = [
        f"slo.{k}={v}" for k, v in floor_cfg.slo.items() if k.endswith("_s") and v is not None
    ]
    settings = record["settings"]
    overrides = [
        "workload=comparison",
        f"engine.dtype={floor_cfg.engine.dtype}",
        f"engine.kv_budget={floor_cfg.engine.kv_budget}",
        "backend=simulated",
        f"simulate.cost_model={cost}",
        f"search.strategies=[{','.join(strategies)}]",
        *(
            f"search.{key}={settings[key]}"
            for key in (
                "requests",
                "max_requests",
                "floor_requests",
                "ceiling_requests",
                "resolution",
                "confidence",
                "budget_s",
            )
        ),
        f"search.out_dir={out / 'search'}",
        f"replay.skip_idle={floor_cfg.get('replay', {}).get('skip_idle', False)}",
        *limits,
    ]  # fmt: skip  (budget_s: simulated seconds, as it had)
    result = search(overrides, compose, run_reported)
    measured = {k["strategy"]: k for k in record["knees"]}
    rows = []
    for knee in result.knees:
        real = measured[knee.strategy]
        rows.append({
            "strategy": knee.strategy,
            "measured": [real["estimate"], real["low"], real["high"]],
            "simulated": [knee.estimate, knee.low, knee.high],
        })  # fmt: skip
        print(f"{knee.strategy}: knee measured {rows[-1]['measured']} (estimate, low, high), "
              f"simulated {rows[-1]['simulated']}")  # fmt: skip
    return rows


if __name__ == "__main__":
    main()
