"""The knee search judged at a GPU's speed: the search as a user runs it on an H100, on the
real engine behind the simulator's clock, against knees found once from long runs.

`scripts.search_study`'s first scenario draws each probe's ratios from a formula fitted
to this CPU. Here the prober is the engine itself (`backend=simulated`: the real schedulers,
KV managers and batching, each step's time from the H100 preset's cost model,
`simulate.hardware=h100-80gb`), so probes from an empty server, queues forming and
preemption are what the engine does, at a GPU's speed, where a 48-request probe near a knee
lasts seconds. A simulation has no noise but the workload's draw: each search draws its own
requests (`workload.seed`), as each run on a machine does.

- Setups: the embedded model as `make run` serves it (its overrides, `make
  comparison-args`), and dummy-llama3-8b in bf16 on the same workload.
- The SLO: scaled from the first strategy's floor run as `make run` scales it, once per setup,
  then given to every search as absolute limits (so every search and every true knee is
  judged against the same limits).
- True knees: each strategy's rate where the `target`-quantile of the SLO ratios of a long run
  (`TRUTH_REQUESTS` requests, the first `WARMUP_SHARE` left out as a warm-up) crosses 1,
  bisected in log rate to `TRUTH_PRECISION`, on two workload draws that must agree within
  `TRUTH_AGREEMENT` (else the runs are doubled, up to `MOST_TRUTH_REQUESTS`; the draws are
  kept beside the truth, their geometric mean); found once and kept in `CACHE` with the
  commit it was found at (a change to the engine or the cost model asks for it again: delete
  the setup's entry).
- Searches: `servelab search` itself (`knee_search.search`) with the setup's overrides, the
  SLO above, `search.budget_s` on the simulated clock (what the probes would take on the
  GPU) and the workload seed moved per search.

Printed per knee and per pair: coverage, median and 80th-percentile width, share bounded, and
for a pair the share whose lead is shown (low end above 1), as the first scenario prints.

    python -m scripts.search_study --scenario h100 [--setup embedded] [--searches 10]
        [--strategies orca,vllm] [--budget-s 840] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from scripts.search_study import HEADER, Row, rows_of
from servelab.harness.measure.slo.scaled import scaled_limits
from servelab.harness.run.compose import compose
from servelab.harness.search.knee_search import search
from servelab.harness.search.probe_ratios import probe_quantile
from servelab.harness.search.probes import ProbeSpec, RunProber
from servelab.harness.search.result import StrategyResult
from servelab.harness.search.text import rate_text

GPU = ("backend=simulated", "simulate.hardware=h100-80gb")
SLO_SCALE = {"ttft_s": 8.0, "normalized_latency_s": 2.0}  # make run's RUN_SLO
STRATEGIES = ("fastertransformer", "orca", "orca-chunked", "vllm")
TRUTH_REQUESTS = 2000  # a long run's requests (doubled while two draws disagree)
MOST_TRUTH_REQUESTS = 8000
WARMUP_SHARE = 0.1  # of a long run's requests, left out: the server starts empty
TRUTH_PRECISION = 0.02  # the bisection stops when its bracket's high / low is within 1 + this
TRUTH_AGREEMENT = 0.05  # two draws' knees must agree within this
CACHE = Path(__file__).with_name("search_truth.json")


def comparison_args() -> list[str]:
    """`make run`'s overrides but its SLO and budget (`make comparison-args`)."""
    out = subprocess.run(
        ["make", "-s", "--no-print-directory", "comparison-args"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return [arg for arg in out.stdout.split() if not arg.startswith("search.slo_scale.")]


def setup_overrides(setup: str) -> list[str]:
    """The setup's overrides at a GPU's speed."""
    comparison = comparison_args()
    if setup == "embedded":
        return [*comparison, *GPU]
    if setup == "llama3-8b":
        kept = [a for a in comparison if not a.startswith(("engine.dtype=", "engine.kv_budget="))]
        return [*kept, "model=dummy-llama3-8b", "engine.dtype=bf16", *GPU]
    raise ValueError(f"no setup {setup!r}; one of embedded, llama3-8b")


def run_quietly(cfg: DictConfig, run_dir: Path) -> dict:
    from servelab.harness.run.run import run

    return run(cfg, run_dir, progress=False)


def slo_overrides(overrides: list[str], strategy: str, work: Path) -> list[str]:
    """The SLO `make run` scales from `strategy`'s floor run, as absolute `slo.*` overrides."""
    cfg = compose([*overrides, f"strategy={strategy}"])
    prober = RunProber(cfg, work / "reference", 0.95, run_quietly)
    floor_requests = int(cfg.search.floor_requests)
    summary, requests = prober.reference(floor_requests)
    limits = scaled_limits(SLO_SCALE, summary, requests)
    unset = [] if "ttft_s" in limits else ["slo.ttft_s=null"]
    return [*unset, *(f"slo.{key}={value!r}" for key, value in limits.items())]


def long_run_quantile(cfg: DictConfig, rate: float, requests: int, draw: int, work: Path) -> float:
    """The `slo.attainment`-quantile of a long run's steady requests' SLO ratios at `rate`
    (inf where its ratios rise through it: over capacity). Served to the end: no early stop."""
    prober = RunProber(cfg, work, None, run_quietly)
    outcome = prober.run(ProbeSpec("rate", requests, rate, draw=draw))
    shutil.rmtree(outcome.run_dir, ignore_errors=True)
    found = probe_quantile(outcome.ratios, prober.slo.attainment, 0.95, WARMUP_SHARE)
    return math.inf if found.over_capacity else found.quantile


def true_knee_of_draw(cfg: DictConfig, requests: int, draw: int, work: Path) -> float:
    """One draw's knee: halved from the ceiling until a long run meets the SLO quantile, then
    bisected in log rate; the crossing interpolated in log-log within the last bracket."""
    prober = RunProber(cfg, work, None, run_quietly)
    top = prober.run(ProbeSpec("ceiling", 256))
    shutil.rmtree(top.run_dir, ignore_errors=True)
    ceiling = float(top.request_throughput or 0.0)
    if ceiling <= 0:
        return 0.0
    low: tuple[float, float] | None = None
    high: tuple[float, float] = (ceiling, math.inf)
    rate = ceiling / 2
    while True:
        quantile = long_run_quantile(cfg, rate, requests, draw, work)
        print(f"  draw {draw}: {rate:.4g} req/s, {requests} requests: q {quantile:.3g}", flush=True)
        if quantile <= 1:
            low = (rate, quantile)
        else:
            high = (rate, quantile)
        if low is None:
            if rate < ceiling / 256:
                return 0.0
            rate /= 2
        elif high[0] / low[0] <= 1 + TRUTH_PRECISION:
            break
        else:
            rate = math.sqrt(low[0] * high[0])
    (r0, q0), (r1, q1) = low, high
    if not math.isfinite(q1) or q0 <= 0:
        return math.sqrt(r0 * r1)
    share = (0 - math.log(q0)) / (math.log(q1) - math.log(q0))
    return math.exp(math.log(r0) + share * (math.log(r1) - math.log(r0)))


@dataclass(frozen=True)
class Truth:
    knee: float  # the two draws' geometric mean
    draws: tuple[float, float]
    requests: int


def true_knee(cfg: DictConfig, work: Path) -> Truth:
    """The knee from long runs on two draws, lengthened until they agree."""
    requests = TRUTH_REQUESTS
    while True:
        a, b = (true_knee_of_draw(cfg, requests, draw, work) for draw in (0, 1))
        agree = a > 0 and b > 0 and max(a, b) / min(a, b) <= 1 + TRUTH_AGREEMENT
        if agree or requests * 2 > MOST_TRUTH_REQUESTS:
            return Truth(math.sqrt(a * b), (a, b), requests)
        requests *= 2


def truths(setup: str, strategies: tuple[str, ...], say=print) -> tuple[list[str], dict]:
    """The setup's SLO overrides and each strategy's true knee, from the cache where found
    before (keyed by setup, its overrides and the strategy)."""
    overrides = setup_overrides(setup)
    cache = json.loads(CACHE.read_text()) if CACHE.exists() else {}
    key = " ".join(overrides)
    entry = cache.setdefault(setup, {})
    if entry.get("overrides") != key:
        entry.clear()
        entry["overrides"] = key
        entry["commit"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if "slo" not in entry:
            entry["slo"] = slo_overrides(overrides, strategies[0], work)
            say(f"{setup}: SLO {' '.join(entry['slo'])}")
        knees = entry.setdefault("knees", {})
        for strategy in strategies:
            if strategy in knees:
                continue
            say(f"{setup}: finding {strategy}'s true knee from long runs ...")
            cfg = compose([*overrides, *entry["slo"], f"strategy={strategy}"])
            found = true_knee(cfg, work / strategy)
            knees[strategy] = {"knee": found.knee, "draws": found.draws, "requests": found.requests}
            say(f"{setup}: {strategy} {found.knee:.4g} req/s (draws {found.draws})")
            CACHE.write_text(json.dumps(cache, indent=2))  # each as found: hours in all
    return entry["slo"], {s: knees[s]["knee"] for s in strategies}


def one_search(
    overrides: list[str], strategies: tuple[str, ...], budget_s: float, seed: int, out: Path
) -> list[StrategyResult]:
    args = [
        *overrides, f"search.strategies=[{','.join(strategies)}]", f"search.budget_s={budget_s}",
        f"workload.seed={seed}", f"search.out_dir={out}",
    ]  # fmt: skip
    return search(args, compose, run_quietly).knees


def evaluate(setup: str, strategies: tuple[str, ...], searches: int, budget_s: float, seed: int,
             policy: tuple[str, ...] = (), say=print) -> list[Row]:  # fmt: skip
    """`searches` searches of the setup at a GPU's speed: a row per knee, then per pair."""
    slo, truth = truths(setup, strategies, say)
    overrides = [*setup_overrides(setup), *slo, *policy]
    runs = []
    for i in range(searches):
        with tempfile.TemporaryDirectory() as tmp:
            runs.append(one_search(overrides, strategies, budget_s, seed + i, Path(tmp)))
        say(
            f"search {i + 1}/{searches}: "
            + ", ".join(f"{k.strategy} [{rate_text(k.low)}, {rate_text(k.high)}]" for k in runs[-1])
        )
    return rows_of(truth, runs)


def truth_commit(setup: str) -> str:
    """The commit the setup's true knees were found at."""
    return json.loads(CACHE.read_text()).get(setup, {}).get("commit", "?")


def main(args: argparse.Namespace) -> None:
    """The scenario's table, as `scripts.search_study` prints the first one's."""
    strategies = tuple(s for s in args.strategies.split(",") if s)
    policy = tuple(f"search.{key}={value:g}" for key in ("span", "warmup")
                   if (value := getattr(args, key)) is not None)  # fmt: skip
    rows = evaluate(args.setup, strategies, args.searches, args.budget_s, args.seed, policy)
    print(
        f"{args.searches} searches of {args.setup} at an H100's speed (backend=simulated "
        f"simulate.hardware=h100-80gb), {args.budget_s:g} s each on the simulated clock; true "
        f"knees from long runs ({CACHE.name}, found at {truth_commit(args.setup)}); "
        f"{' '.join(policy) or 'the search as configured'}"
    )
    print(HEADER)
    print("\n".join(r.line() for r in rows))
