"""Parallel sampling, paged against contiguous KV: one row per n from `measure.sh parallel`.

Usage: python -m scripts.parallel_sampling_table DIR
DIR holds one run directory per strategy and n (`orca-n2`, `vllm-n2`, ...). Per n it prints,
by the harness's own definitions, each strategy's output throughput, the KV slots allocated
per running sequence (time-weighted over the measured steps: the memory each sample costs),
the peak number of sequences running at once, and the ratios vllm / orca: the throughput
gained and the KV memory per sample saved.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from servelab.harness.measure.metrics import measured_window, summarize
from servelab.harness.measure.slo.limits import SLO
from servelab.reports.load import load_run

STRATEGIES = ("orca", "vllm")  # contiguous KV, paged KV (both iteration-level batching)


@dataclass(frozen=True)
class Measured:
    output_throughput: float
    slots_per_sequence: float
    peak_running: int


def measured(run_dir: Path) -> Measured:
    run = load_run(run_dir)
    summary = summarize(run.request_records, run.step_records, SLO())
    window = measured_window([r for r in run.request_records if not r.excluded])
    steps = [s for s in run.step_records if window and window.holds(s) and s.running]
    weight = sum(s.t_end - s.t_start for s in steps)
    per_sequence = sum((s.kv_allocated_slots / s.running) * (s.t_end - s.t_start) for s in steps)
    return Measured(summary["output_throughput"], per_sequence / weight, summary["peak_running"])


def main(args: list[str]) -> None:
    root = Path(args[0])
    counts = sorted({int(p.name.split("-n")[1]) for p in root.iterdir() if "-n" in p.name})
    print(
        "| n | orca tok/s | vllm tok/s | throughput vllm/orca | orca KV slots/seq "
        "| vllm KV slots/seq | KV per sample saved | peak running orca / vllm |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for n in counts:
        orca, vllm = (measured(root / f"{name}-n{n}") for name in STRATEGIES)
        print(
            f"| {n} | {orca.output_throughput:.1f} | {vllm.output_throughput:.1f} "
            f"| {vllm.output_throughput / orca.output_throughput:.2f}x "
            f"| {orca.slots_per_sequence:.0f} | {vllm.slots_per_sequence:.0f} "
            f"| {1 - vllm.slots_per_sequence / orca.slots_per_sequence:.0%} "
            f"| {orca.peak_running} / {vllm.peak_running} |"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
