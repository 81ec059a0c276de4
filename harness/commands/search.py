"""`servelab search`: the highest request rate each strategy sustains under an SLO, by bisection.

A rate is sustained by the one SLO rule (`harness.measure.slo`): at least `slo.attainment` of
the requests meet every configured limit, each latency from arrival, failed requests counted
as misses; the run's summary says so (`sustained`). Each probe is a full run with
`workload.arrival.rate` set, kept in its own run directory under
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

from harness.commands.config import compose
from harness.errors import ConfigError
from harness.measure.slo import SLO

SUMMARY = "the highest request rate each strategy sustains under the SLO (bisection)"
USAGE = """usage: servelab search [search.strategies=[a,b]] slo.ttft_s=S ... [OVERRIDE ...]

Bisects workload.arrival.rate between search.low and search.high for every strategy; a
rate is sustained when at least slo.attainment of its requests meet every SLO limit."""


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


def sustained(summary: dict) -> bool:
    """A probe passes when its run completed and the SLO rule says it sustained its load."""
    return summary.get("status") == "complete" and summary.get("sustained") is True


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
    if not SLO.from_config(cfg.slo).configured:
        raise ConfigError(
            "slo", "search needs at least one limit, e.g. slo.ttft_s=2 or slo.tpot_s=0.1"
        )
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
            ok = sustained(summary)
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


def main(args: list[str]) -> None:
    from harness.runner.run import completed_summary, run

    def run_or_reuse(cfg: DictConfig, run_dir: Path) -> dict:
        return completed_summary(cfg, run_dir) or run(cfg, run_dir)

    results, out_dir = search(args, compose, run_or_reuse)
    print(render_search(results))
    print(f"probes and search.json under {out_dir}")
