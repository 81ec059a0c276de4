"""`servelab search`: the highest request rate each strategy sustains under an SLO, by bisection.

A rate is sustained when every configured p99 limit holds (`slo.ttft_s`, `slo.tpot_s`,
`slo.e2e_s` against the run's p99), p50 normalized latency stays under
`slo.normalized_latency_s` when that is set (the vLLM paper's criterion, and the sweep
report's), and at least `search.goodput_share` of the requests meet every limit. Each
probe is a full run with `workload.arrival.rate` set, kept in its own run directory under
`search.out_dir/STRATEGY/rate-R`, so the evidence for every answer can be opened (and a
rerun reuses complete probes).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from omegaconf import DictConfig
from rich.console import Console
from rich.table import Table

from harness.errors import ConfigError


@dataclass
class Probe:
    rate: float
    sustained: bool
    run_dir: str
    slo_attainment: float | None


@dataclass
class SearchResult:
    strategy: str
    max_rate: float | None  # None: not even the lowest rate is sustained
    bounded_above: bool  # False: the highest rate tried was sustained
    probes: list[Probe] = field(default_factory=list)


def sustained(summary: dict, cfg: DictConfig) -> bool:
    if summary.get("status") != "complete" or not summary.get("completed"):
        return False
    for limit_key, metric in (("ttft_s", "ttft"), ("tpot_s", "tpot"), ("e2e_s", "e2e")):
        limit = cfg.slo.get(limit_key)
        p99 = summary[metric]["p99"]
        if limit is not None and p99 is not None and p99 > limit:
            return False
    normalized_limit = cfg.slo.get("normalized_latency_s")
    p50 = summary["normalized_latency"]["p50"]
    if normalized_limit is not None and (p50 is None or p50 > normalized_limit):
        return False
    share = summary.get("slo_attainment") or 0.0
    return share >= float(cfg.search.goodput_share)


def bisect_rate(
    probe: Callable[[float], Probe], low: float, high: float, iterations: int
) -> tuple[float | None, bool, list[Probe]]:
    """Bisection over [low, high]: (highest sustained rate, bounded above, probes)."""
    probes = [probe(low)]
    if not probes[-1].sustained:
        return None, True, probes
    probes.append(probe(high))
    if probes[-1].sustained:
        return high, False, probes
    good, bad = low, high
    for _ in range(iterations):
        middle = (good + bad) / 2
        probes.append(probe(middle))
        if probes[-1].sustained:
            good = middle
        else:
            bad = middle
    return good, True, probes


def search(
    base_overrides: list[str],
    compose: Callable[[list[str]], DictConfig],
    run: Callable[[DictConfig, Path], dict],
) -> tuple[list[SearchResult], Path]:
    cfg = compose(base_overrides)
    node = cfg.search
    if not node.strategies:
        raise ConfigError("search.strategies", "name at least one strategy preset")
    low, high = float(node.low), float(node.high)
    if not 0 < low < high:
        raise ConfigError("search.low", f"need 0 < search.low < search.high, got {low}, {high}")
    out_dir = Path(str(node.out_dir))
    results = []
    for strategy in node.strategies:

        def probe(rate: float, strategy: str = strategy) -> Probe:
            overrides = [*base_overrides, f"strategy={strategy}", f"workload.arrival.rate={rate}"]
            probe_cfg = compose(overrides)
            run_dir = out_dir / strategy / f"rate-{rate:.4g}"
            summary = run(probe_cfg, run_dir)
            ok = sustained(summary, probe_cfg)
            return Probe(rate, ok, str(run_dir), summary.get("slo_attainment"))

        best, bounded, probes = bisect_rate(probe, low, high, int(node.iterations))
        results.append(SearchResult(strategy, best, bounded, probes))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "search.json").write_text(json.dumps([asdict(r) for r in results], indent=2))
    return results, out_dir


def render_search(results: list[SearchResult]) -> str:
    table = Table(title="highest sustained request rate")
    for column in ("strategy", "max rate (req/s)", "probes (rate: sustained?)"):
        table.add_column(column)
    for result in results:
        if result.max_rate is None:
            answer = "none (lowest rate fails)"
        else:
            answer = f"{result.max_rate:.3g}" + ("" if result.bounded_above else "+ (upper end)")
        probes = ", ".join(f"{p.rate:.3g}:{'y' if p.sustained else 'n'}" for p in result.probes)
        table.add_row(result.strategy, answer, probes)
    console = Console(record=True, width=120)
    with console.capture() as capture:
        console.print(table)
    return capture.get()
