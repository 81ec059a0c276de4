"""`servelab serve` stops cleanly on SIGTERM with a response still streaming: once the grace
is over (none here) the stream ends properly, with an error event and `[DONE]`, the process
says so and exits with status 0, and the port is closed."""

from __future__ import annotations

import json
import signal

import httpx
import pytest

from tests.server_process import start_server


@pytest.mark.integration
def test_sigterm_mid_stream_stops_cleanly() -> None:
    overrides = [
        "model=dummy-tiny",
        "engine.dtype=fp32",
        "strategy=vllm",
        "serve.shutdown_grace_s=0",
    ]
    server = start_server(overrides, env={"OMP_NUM_THREADS": "1"})
    body = {
        "model": "dummy-tiny",
        "prompt": [5, 6, 7],
        "max_tokens": 480,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }
    with httpx.Client(base_url=server.url, timeout=60) as http:
        with http.stream("POST", "/v1/completions", json=body) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("data: ")
            assert server.stop(signal.SIGTERM) == 0
            events = [line for line in lines if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]"
        error = json.loads(events[-2].removeprefix("data: "))["error"]
        assert error["message"] == "the request failed: the server is shutting down"
        with pytest.raises(httpx.ConnectError):
            http.get("/health")
    assert "".join(server.output).rstrip().endswith("servelab: stopped")
