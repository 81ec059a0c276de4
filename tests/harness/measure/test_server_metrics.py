"""The server's Prometheus metrics scraped during an endpoint run
(`harness/measure/server_metrics.py`): each server's gauges found under its own names, values
reduced across label sets, a row per period on the run's clock, a failed scrape an empty row
counted in the summary. The expositions below are in the formats vLLM (v1 and v0) and SGLang
publish; against `servelab serve` the scrape is checked in `test_serve_http.py`."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pandas as pd
import pytest

from servelab.harness.measure.server_metrics import (
    COLUMNS,
    ServerMetricsScraper,
    find_gauges,
    gauges_in,
    read_columns,
    samples_by_name,
    server_metrics_summary,
)
from servelab.reports.run_figures import telemetry_figure

VLLM = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 7.0
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.25
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 1234.0
"""
VLLM_V0 = """\
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.9
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 1.0
"""
SGLANG = """\
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m"} 0.28
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m"} 12.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m"} 4.0
"""
LLAMACPP = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 0
# HELP llamacpp:requests_processing Number of requests processing
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# HELP llamacpp:requests_deferred Number of requests deferred
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 5
"""  # llama-server --metrics, build 0c1e570: no KV usage gauge


def test_each_server_s_gauges_under_its_own_names() -> None:
    source, names = gauges_in(samples_by_name(VLLM)) or ("", {})
    assert source == "vllm" and set(names) == set(COLUMNS)
    assert read_columns(VLLM, names) == {  # requests summed over engines, the share averaged
        "running_requests": 5.0, "waiting_requests": 7.0, "kv_usage_share": 0.375,
    }  # fmt: skip
    source, names = gauges_in(samples_by_name(VLLM_V0)) or ("", {})
    assert source == "vllm" and names == {
        "kv_usage_share": "vllm:gpu_cache_usage_perc",
        "running_requests": "vllm:num_requests_running",
    }
    assert read_columns(VLLM_V0, names) == {"kv_usage_share": 0.9, "running_requests": 1.0}
    source, names = gauges_in(samples_by_name(SGLANG)) or ("", {})
    assert source == "sglang"
    assert read_columns(SGLANG, names) == {
        "kv_usage_share": 0.28, "running_requests": 12.0, "waiting_requests": 4.0,
    }  # fmt: skip
    source, names = gauges_in(samples_by_name(LLAMACPP)) or ("", {})
    assert source == "llamacpp"
    assert read_columns(LLAMACPP, names) == {"running_requests": 2.0, "waiting_requests": 5.0}
    assert gauges_in(samples_by_name("# TYPE other gauge\nother 1.0\n")) is None


class _Exposition(BaseHTTPRequestHandler):
    body = VLLM
    failing = False

    def do_GET(self) -> None:  # noqa: N802 (the handler's name)
        if self.path != "/metrics" or _Exposition.failing:
            self.send_error(404 if self.path != "/metrics" else 503)
            return
        data = _Exposition.body.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        del args


@pytest.fixture
def exposition() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Exposition)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Exposition.body, _Exposition.failing = VLLM, False
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_scraped_every_period_a_failed_scrape_an_empty_row(exposition: str, tmp_path: Path) -> None:
    gauges, note = find_gauges(exposition, {}, 5.0)
    assert gauges is not None and gauges.source == "vllm" and note.startswith("vllm: ")
    start = time.monotonic()
    scraper = ServerMetricsScraper(
        gauges, tmp_path / "m.csv", 0.05, lambda: time.monotonic() - start
    )
    scraper.start()
    time.sleep(0.3)
    _Exposition.failing = True  # the server stops answering: rows go on, empty
    time.sleep(0.2)
    scraper.stop()
    table = pd.read_csv(tmp_path / "m.csv")
    assert list(table.columns) == ["t", *COLUMNS] and table["t"].is_monotonic_increasing
    answered = table.dropna()
    assert len(answered) >= 3 and (answered["running_requests"] == 5.0).all()
    summary = server_metrics_summary(tmp_path / "m.csv")
    assert summary is not None and summary["samples"] == len(table) >= 6
    assert summary["failed"] == len(table) - len(answered) >= 2
    assert summary["kv_usage_share_max"] == 0.375 and summary["waiting_requests_mean"] == 7.0
    assert telemetry_figure(table, "The server's metrics over time") is not None
    assert server_metrics_summary(tmp_path / "none.csv") is None


def test_a_server_without_the_gauges_is_said_and_not_scraped(exposition: str) -> None:
    _Exposition.body = "# TYPE other gauge\nother 1.0\n"
    gauges, note = find_gauges(exposition, {}, 5.0)
    assert gauges is None and "names no gauge servelab reads" in note
    gauges, note = find_gauges(f"{exposition}/nowhere", {}, 5.0)
    assert gauges is None and "404" in note
