"""The one-screen table printed at the end of a run (labels and units from the summary schema)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from servelab.harness.measure.summary_schema import LATENCY_METRICS, METRICS

HEAD_ROWS = (  # (summary key, decimals; None for a count)
    ("duration_s", 2),
    ("request_throughput", 2),
    ("output_throughput", 1),
    ("total_throughput", 1),
    ("goodput", 2),
    ("kv_waste_mean", 3),
    ("peak_running", None),
    ("preemptions", None),
)


SERVER_ROWS = (  # (server_metrics column, what it counts), scraped from the server's /metrics
    ("running_requests", "running requests"),
    ("waiting_requests", "waiting requests"),
    ("kv_usage_share", "KV cache usage"),
)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _value(value: float | None, digits: int | None, unit: str) -> str:
    if value is None:
        return "-"
    text = str(value) if digits is None else f"{value:.{digits}f}"
    return f"{text} {unit}" if unit and unit != "fraction" else text


def render_summary(summary: dict, run_dir: str, console: Console | None = None) -> None:
    console = console or Console(stderr=False)
    strategy = summary["strategy"]
    if "backend" in strategy:  # a peer: an HTTP endpoint or transformers
        served = f"{strategy['name']} (backend {strategy['backend']})"
    else:
        axes = f"{strategy['batching']} + {strategy['kv']}, heads {strategy['heads']}"
        served = f"{strategy['name']} ({axes})"
    title = f"{served} on {summary['workload']}"
    if summary.get("simulated"):
        title = f"SIMULATED, not measured: {title}"
    head = Table(title=title, show_header=False, box=None)
    head.add_row(
        "status", summary["status"] + (f" ({summary['error']})" if summary["error"] else "")
    )
    if summary.get("dtype"):
        head.add_row("dtype", f"{summary['dtype']['name']} ({summary['dtype']['reason']})")
    head.add_row("completed / failed", f"{summary['completed']} / {summary['failed']}")
    skipped = summary.get("idle_skipped")
    if skipped:
        head.add_row(
            "idle skipped",
            f"{skipped['s']:.1f} s of the run's clock in {skipped['spans']} spans with nothing "
            "in flight (replay.skip_idle)",
        )
    for name, digits in HEAD_ROWS:
        head.add_row(METRICS[name].label, _value(summary[name], digits, METRICS[name].unit))
    server = summary.get("server_metrics") or {}  # a peer's own view, where it was scraped
    for column, what in SERVER_ROWS:
        peak, mean = server.get(f"{column}_max"), server.get(f"{column}_mean")
        if peak is not None and mean is not None:
            head.add_row(f"server: {what} (peak / mean)", f"{peak:.3g} / {mean:.3g}")
    cached = summary.get("cached_prompt_share")
    if cached is not None:
        warm = summary.get("warm_cache_share")
        said = "" if warm is None else f" ({warm:.1%} from a cache this run did not fill)"
        head.add_row(METRICS["cached_prompt_share"].label, f"{cached:.1%}{said}")
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
    for name in LATENCY_METRICS:
        values = summary[name]
        latency.add_row(name, *(_ms(values[c]) for c in ("mean", "p50", "p90", "p99")))
    console.print(latency)
    for line in summary.get("flags") or []:  # what makes these figures doubtful
        console.print(f"flag: {line}")
    console.print(f"run directory: {run_dir}")
