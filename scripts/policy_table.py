"""Admission policies side by side: one row per run directory of `measure.sh policy`.

Usage: python -m scripts.policy_table RUN_DIR ...
Prints the policy, the prefix hit rate (prompt tokens found in blocks other requests
computed, over prompt tokens looked up), p50/p99 TTFT, p50/p99 normalized latency and output
throughput, each by the harness's own definitions.
"""

from __future__ import annotations

import sys
from pathlib import Path

from servelab.harness.measure.metrics import summarize
from servelab.harness.measure.slo.limits import SLO
from servelab.reports.load import load_run


def row(run_dir: Path) -> str:
    run = load_run(run_dir)
    summary = summarize(run.request_records, run.step_records, SLO())
    last = run.step_records[-1].counters if run.step_records else {}
    queried = last.get("prefix_query_tokens") or 0
    hit = f"{last.get('prefix_hit_tokens', 0) / queried:.1%}" if queried else "–"
    ttft, norm = summary["ttft"], summary["normalized_latency"]
    return (
        f"| {run.strategy.get('policy', 'fcfs')} | {hit} | {ttft['p50']:.2f} | {ttft['p99']:.2f} "
        f"| {norm['p50']:.3f} | {norm['p99']:.3f} | {summary['output_throughput']:.1f} |"
    )


def main(args: list[str]) -> None:
    print(
        "| policy | prefix hit rate | TTFT p50 (s) | TTFT p99 (s) | norm. lat. p50 (s/tok) "
        "| norm. lat. p99 | output tok/s |"
    )
    print("|---|---|---|---|---|---|---|")
    for arg in args:
        print(row(Path(arg)))


if __name__ == "__main__":
    main(sys.argv[1:])
