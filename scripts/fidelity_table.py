"""What each measurement-fidelity fix moved: one table from the runs of `measure.sh fidelity`.

For each run directory (the code before the fixes, then the fixes switched on one by one) it
prints p99 TTFT, p50 normalized latency and output throughput of `fastertransformer` and
`orca`, and their throughput ratio. "Old definitions" recompute the same records the way the
code before the fixes did (latencies from the moment the engine noticed the request,
`t_send`; E2E at the last token; duration from the first send); the other rows use the
harness's own metrics, latencies from arrival.

Usage: python scripts/fidelity_table.py ROW=FT_RUN_DIR,ORCA_RUN_DIR[,old] ...
  (`,old` recomputes that row's records with the old definitions)
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from servelab.harness.measure.metrics import summarize
from servelab.harness.measure.slo.limits import SLO
from servelab.reports.load import load_run


def old_definitions(run_dir: Path) -> dict[str, float]:
    """p99 TTFT, p50 normalized latency and output throughput as the old code defined them."""
    records = [r for r in load_run(run_dir).request_records if r.succeeded and not r.excluded]
    ttft = [r.token_times[0] - r.t_send for r in records]
    normalized = [(r.token_times[-1] - r.t_send) / len(r.token_times) for r in records]
    duration = max(r.token_times[-1] for r in records) - min(r.t_send for r in records)
    tokens = sum(len(r.token_times) for r in records)
    return {
        "ttft_p99": float(np.percentile(ttft, 99)),
        "normalized_p50": float(np.percentile(normalized, 50)),
        "throughput": tokens / duration,
    }


def new_definitions(run_dir: Path) -> dict[str, float]:
    run = load_run(run_dir)
    summary = summarize(run.request_records, run.step_records, SLO())
    return {
        "ttft_p99": summary["ttft"]["p99"],
        "normalized_p50": summary["normalized_latency"]["p50"],
        "throughput": summary["output_throughput"],
    }


def main(args: list[str]) -> None:
    header = (
        "| step | FT p99 TTFT (s) | FT p50 norm. lat. (s/tok) | FT tok/s | orca p99 TTFT (s) "
        "| orca p50 norm. lat. | orca tok/s | orca / FT throughput |"
    )
    print(header)
    print("|" + "---|" * 8)
    for arg in args:
        label, _, dirs = arg.partition("=")
        parts = dirs.split(",")
        measure = old_definitions if parts[-1] == "old" else new_definitions
        ft, orca = (measure(Path(p)) for p in parts[:2])
        print(
            f"| {label} | {ft['ttft_p99']:.2f} | {ft['normalized_p50']:.3f} | "
            f"{ft['throughput']:.1f} | {orca['ttft_p99']:.2f} | {orca['normalized_p50']:.3f} | "
            f"{orca['throughput']:.1f} | {orca['throughput'] / ft['throughput']:.2f} |"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
