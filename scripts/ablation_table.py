"""Static batching's switches one by one: orca's gain over each variant of the baseline.

Usage: python scripts/ablation_table.py ORCA_RUN_DIR LABEL=FT_RUN_DIR ...
Prints, per static-batching variant, its output throughput and p50 normalized latency, and
orca's throughput and p50 normalized latency relative to it (the harness's definitions).
"""

from __future__ import annotations

import sys
from pathlib import Path

from scripts.fidelity_table import new_definitions


def main(args: list[str]) -> None:
    orca = new_definitions(Path(args[0]))
    print(
        "| static batching variant | tok/s | p50 norm. lat. (s/tok) | orca throughput × "
        "| orca p50 norm. lat. × |"
    )
    print("|---|---|---|---|---|")
    for arg in args[1:]:
        label, _, path = arg.partition("=")
        static = new_definitions(Path(path))
        print(
            f"| {label} | {static['throughput']:.1f} | {static['normalized_p50']:.3f} | "
            f"{orca['throughput'] / static['throughput']:.2f} | "
            f"{orca['normalized_p50'] / static['normalized_p50']:.2f} |"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
