"""The fake OpenAI-compatible server (`harness/serving/fake_server.py`) and the load
generator's self-benchmark against it (`scripts/client_bench.py`): every request gets its
tokens at once, the client records every one, and the send lag is measured. How fast the
client goes is a benchmark (`python -m scripts.client_bench`), never asserted here."""

from __future__ import annotations

from pathlib import Path

from scripts.client_bench import at_rate
from servelab.harness.measure.rundir import read_requests
from servelab.harness.serving.process import start_fake_server


def test_the_client_receives_every_token_the_fake_server_streams(tmp_path: Path) -> None:
    server = start_fake_server(tokens=5)
    try:
        result = at_rate(server.url, rate=40.0, seconds=1.0, tokens=5, out=tmp_path)
    finally:
        assert server.stop() == 0
    assert result.rate == 40.0 and result.requests == 40
    records = read_requests(tmp_path / "rate-40")
    assert len(records) == 40 and all(r.finish_reason == "length" for r in records)
    assert all(r.output_len == 5 == len(r.token_times) for r in records)
    assert all(r.output_ids == [1, 2, 3, 4, 5] for r in records)  # the ids it streamed
    assert 0 <= result.lag_p50_ms <= result.lag_p95_ms <= result.lag_p99_ms
    assert result.achieved > 0
