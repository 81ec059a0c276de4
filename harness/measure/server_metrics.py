"""The server's own state during an endpoint run, scraped from its Prometheus `/metrics`.

A client sees latencies; the server knows what made them: how full its KV cache was, how
many requests it ran and how many waited. vLLM, SGLang, llama.cpp (`--metrics`, which a server
the run starts gets) and `servelab serve` publish these as gauges, each under its own names
(`SERVERS`); a run finds which before its clock starts
(`find_gauges`), then a thread reads them every `period_s` into `server_metrics.csv`, on the
run's clock as `telemetry.csv` is, as the three columns every server shares here (`COLUMNS`),
and the run report plots them against time. A server without `/metrics`, or whose metrics
name none of these gauges, is said once (the note in `meta.json`) and nothing is scraped. A
scrape that fails leaves its row's cells empty and is counted; it never stops the run.
"""

from __future__ import annotations

import csv
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from servelab.harness.measure.telemetry import sample_every

FILE = "server_metrics.csv"
COLUMNS = ("kv_usage_share", "running_requests", "waiting_requests")  # KV allocated, 0..1
SERVERS: dict[str, dict[str, tuple[str, ...]]] = {  # each column's gauge, newest name first
    "vllm": {
        "kv_usage_share": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        "running_requests": ("vllm:num_requests_running",),
        "waiting_requests": ("vllm:num_requests_waiting",),
    },
    "sglang": {
        "kv_usage_share": ("sglang:token_usage",),
        "running_requests": ("sglang:num_running_reqs",),
        "waiting_requests": ("sglang:num_queue_reqs",),
    },
    "llamacpp": {  # with --metrics; its KV usage only where the build still publishes it
        "kv_usage_share": ("llamacpp:kv_cache_usage_ratio",),
        "running_requests": ("llamacpp:requests_processing",),
        "waiting_requests": ("llamacpp:requests_deferred",),
    },
    "servelab": {
        "kv_usage_share": ("servelab_kv_usage",),
        "running_requests": ("servelab_requests_running",),
        "waiting_requests": ("servelab_requests_waiting",),
    },
}


@dataclass(frozen=True)
class ServerGauges:
    """Where a server's `/metrics` is and which of its gauges fill each column."""

    url: str
    headers: dict[str, str]
    source: str  # a key of SERVERS
    names: dict[str, str]  # column -> the gauge this server publishes for it
    timeout_s: float

    def scrape(self) -> dict[str, float]:
        """One reading: each column's value (shares averaged, counts summed over labels)."""
        return read_columns(fetch(self.url, self.headers, self.timeout_s), self.names)


def fetch(url: str, headers: dict[str, str], timeout_s: float) -> str:
    request = urllib.request.Request(f"{url}/metrics", headers=headers)
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return response.read().decode("utf-8", errors="replace")


def samples_by_name(text: str) -> dict[str, list[float]]:
    """Every gauge's sample values in a Prometheus text exposition, by metric name."""
    found: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append(float(sample.value))
    return found


def read_columns(text: str, names: dict[str, str]) -> dict[str, float]:
    samples = samples_by_name(text)
    values = {}
    for column, name in names.items():
        if samples.get(name):
            reduce = np.mean if column == "kv_usage_share" else np.sum
            values[column] = float(reduce(samples[name]))
    return values


def find_gauges(
    url: str, headers: dict[str, str], timeout_s: float
) -> tuple[ServerGauges | None, str]:
    """The server's gauges, or None and why not; asked once, before the run's clock starts."""
    try:
        samples = samples_by_name(fetch(url, headers, timeout_s))
    except (urllib.error.URLError, OSError, ValueError) as err:
        return None, f"no server metrics: GET {url}/metrics failed ({err})"
    found = gauges_in(samples)
    if found is None:
        known = ", ".join(SERVERS)
        return None, f"no server metrics: {url}/metrics names no gauge servelab reads ({known})"
    source, names = found
    gauges = ServerGauges(url, headers, source, names, timeout_s)
    return gauges, f"{source}: {', '.join(names.values())}"


def gauges_in(samples: dict[str, list[float]]) -> tuple[str, dict[str, str]] | None:
    """The first server in SERVERS whose gauges the samples hold, with each column's gauge."""
    for source, columns in SERVERS.items():
        names = {
            column: name
            for column, choices in columns.items()
            for name in [next((n for n in choices if n in samples), None)]
            if name is not None
        }
        if names:
            return source, names
    return None


class ServerMetricsScraper:
    """A thread scraping `gauges` into `path` every `period_s`: one row when started, one
    every period, one when stopped; the run's clock in the `t` column."""

    def __init__(
        self, gauges: ServerGauges, path: Path, period_s: float, clock: Callable[[], float]
    ) -> None:
        self.gauges, self.path, self.period_s, self.clock = gauges, path, period_s, clock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="server-metrics", daemon=True)
        self._file = path.open("w", newline="", encoding="utf-8")
        self._writer = csv.writer(self._file)

    def start(self) -> None:
        self._writer.writerow(["t", *COLUMNS])
        self._sample()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
        self._file.close()

    def _run(self) -> None:
        sample_every(self.period_s, self._stop, self._sample)

    def _sample(self) -> bool:
        t = self.clock()
        try:
            values = self.gauges.scrape()
        except Exception:  # a busy or restarting server: an empty row, counted in the summary
            values = {}
        cells = ["" if c not in values else f"{values[c]:.4f}" for c in COLUMNS]
        self._writer.writerow([f"{t:.6f}", *cells])
        self._file.flush()
        return True


def server_metrics_summary(path: Path) -> dict[str, float | int | None] | None:
    """How many scrapes, how many failed (an empty row), and each column's peak and mean over
    the run; None when nothing was scraped."""
    if not path.is_file():
        return None
    with path.open(newline="", encoding="utf-8") as file:
        rows = list(csv.DictReader(file))
    failed = sum(not any(row.get(column) for column in COLUMNS) for row in rows)
    summary: dict[str, float | int | None] = {"samples": len(rows), "failed": failed}
    for column in COLUMNS:
        values = [float(row[column]) for row in rows if row.get(column)]
        summary[f"{column}_max"] = max(values) if values else None
        summary[f"{column}_mean"] = float(np.mean(values)) if values else None
    return summary
