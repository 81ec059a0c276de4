"""The one-screen table printed at the end of a run."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def render_summary(summary: dict, run_dir: str, console: Console | None = None) -> None:
    console = console or Console(stderr=False)
    strategy = summary["strategy"]
    if "backend" in strategy:  # a peer: an HTTP endpoint or transformers
        served = f"{strategy['name']} (backend {strategy['backend']})"
    else:
        axes = f"{strategy['batching']} + {strategy['kv']}, heads {strategy['heads']}"
        served = f"{strategy['name']} ({axes})"
    title = f"{served} on {summary['workload']}"
    head = Table(title=title, show_header=False, box=None)
    head.add_row(
        "status", summary["status"] + (f" ({summary['error']})" if summary["error"] else "")
    )
    if summary.get("dtype"):
        head.add_row("dtype", f"{summary['dtype']['name']} ({summary['dtype']['reason']})")
    head.add_row("completed / failed", f"{summary['completed']} / {summary['failed']}")
    head.add_row("duration", f"{_num(summary['duration_s'])} s")
    head.add_row("request throughput", f"{_num(summary['request_throughput'])} req/s")
    head.add_row("output throughput", f"{_num(summary['output_throughput'], 1)} tok/s")
    head.add_row("total throughput", f"{_num(summary['total_throughput'], 1)} tok/s")
    head.add_row("goodput", f"{_num(summary['goodput'])} req/s")
    head.add_row("KV waste (time mean)", f"{_num(summary['kv_waste_mean'], 3)}")
    head.add_row("peak running", str(summary["peak_running"]))
    head.add_row("preemptions", str(summary["preemptions"]))
    if summary.get("mfu_mean") is not None:
        head.add_row(
            "MFU / MBU (mean)",
            f"{_num(summary['mfu_mean'], 3)} / {_num(summary.get('mbu_mean'), 3)}",
        )
    if summary.get("acceptance_rate") is not None:
        head.add_row(
            "speculative",
            f"acceptance {_num(summary['acceptance_rate'], 3)}, "
            f"{_num(summary.get('mean_accepted_length'))} tokens / target forward",
        )
    console.print(head)
    latency = Table(title="latency (ms)")
    latency.add_column("metric")
    for column in ("mean", "p50", "p90", "p99"):
        latency.add_column(column, justify="right")
    for name in ("ttft", "tpot", "itl", "e2e", "normalized_latency"):
        values = summary[name]
        latency.add_row(name, *(_ms(values[c]) for c in ("mean", "p50", "p90", "p99")))
    console.print(latency)
    console.print(f"run directory: {run_dir}")
