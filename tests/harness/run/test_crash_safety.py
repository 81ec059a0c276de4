"""A real run killed with SIGKILL mid-way (tiny model, a subprocess): its records are whole up
to the kill, with no torn line, and `servelab summarize` rebuilds the summary and the report
from them, marked incomplete and flagged, so that gates refuse it and a sweep redoes it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from servelab.base.records import RequestRecord, StepRecord
from servelab.harness.measure.flags import INCOMPLETE, refusals
from servelab.harness.measure.rundir import (
    BATCH_BYTES,
    RunWriter,
    encode_line,
    read_records,
    read_requests,
    torn_tail,
)
from servelab.harness.run.summary import summarize_run
from tests.server_process import ROOT

RUN = [
    "model=dummy-tiny",
    "strategy=vllm",
    "engine.dtype=fp32",
    "telemetry.roofline=false",
    "workload=smoke",
    "workload.num_requests=2000",
    "workload.output_len.value=64",
]


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.is_file() else 0


@pytest.mark.integration
def test_a_run_killed_mid_way_keeps_whole_records_and_summarizes_incomplete(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "servelab", *RUN, f"hydra.run.dir={run_dir}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 300
    while _lines(run_dir / "requests.jsonl") < 20:
        assert process.poll() is None, process.stderr.read().decode()[-2000:]  # type: ignore[union-attr]
        assert time.monotonic() < deadline, "the run recorded too little in time"
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait(60)
    assert not (run_dir / "summary.json").exists()
    for name in ("requests.jsonl", "steps.jsonl"):
        path = run_dir / name
        assert not torn_tail(path), f"{name} ends in a torn line"
        text = path.read_text()
        assert all(json.loads(line) for line in text.splitlines()), name
    recorded = len(read_requests(run_dir))
    assert 20 <= recorded < 2000

    result = subprocess.run(
        [sys.executable, "-m", "servelab", "summarize", str(run_dir)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"{run_dir}: incomplete, {recorded} completed" in result.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "incomplete" and summary["completed"] == recorded
    assert summary["not_recorded"] == 2000 - recorded
    assert INCOMPLETE in summary["flag_codes"] and refusals(summary)
    assert summary["steps"] > 0 and summary["output_throughput"] > 0
    page = (run_dir / "report.html").read_text()
    assert "incomplete" in page and "never recorded" in page


def test_records_are_written_one_whole_line_each(tmp_path: Path) -> None:
    """Each record is one write on an appending descriptor: a very long line (thousands of
    token times, far past any stdio buffer) goes out in one piece, and a torn tail left by a
    full disk is ignored by the readers and reported by summarize."""
    writer = RunWriter(tmp_path)
    long = RequestRecord(
        id="0",
        prompt_len=1,
        output_len=5000,
        t_scheduled=0.0,
        t_send=0.0,
        t_done=1.0,
        token_times=[i / 5000 for i in range(5000)],
        output_ids=list(range(5000)),
        finish_reason="length",
        error=None,
    )
    writes: list[int] = []
    real_write = os.write

    def counting_write(descriptor: int, data: bytes) -> int:
        writes.append(len(data))
        return real_write(descriptor, data)

    os.write = counting_write  # type: ignore[assignment]
    try:
        writer.request(long)
    finally:
        os.write = real_write  # type: ignore[assignment]
    writer.close()
    assert len(writes) == 1 and writes[0] > 50_000
    path = tmp_path / "requests.jsonl"
    with path.open("a") as handle:
        handle.write('{"id": "1", "prompt_len"')
    assert torn_tail(path) and read_records(path, RequestRecord)[1] == 1  # the torn line
    assert [r.id for r in read_records(path, RequestRecord)[0]] == [long.id]


def test_a_batched_writer_writes_whole_lines_a_batch_at_a_time(tmp_path: Path) -> None:
    """Within `batched`, lines wait until a batch fills (BATCH_BYTES), then go out whole in one
    write; the rest go when it ends, even when it ends by an error; after it, one line per
    write again."""
    writer = RunWriter(tmp_path)
    steps = tmp_path / "steps.jsonl"
    record = StepRecord(0, 0.0, 0.01, 0.01, 1, 1, 0, 0, 1, 16, 16, 64, 0.0, 0)
    line = encode_line(record.to_json())
    per_batch = -(-BATCH_BYTES // len(line))  # the line that fills a batch sends it
    with pytest.raises(RuntimeError), writer.batched():
        for _ in range(per_batch - 1):
            writer.step(record)
        assert steps.read_bytes() == b""
        writer.step(record)
        assert steps.read_bytes() == line * per_batch
        writer.step(record)
        assert steps.read_bytes() == line * per_batch
        raise RuntimeError("the run failed")
    assert steps.read_bytes() == line * (per_batch + 1)
    writer.step(record)
    assert steps.read_bytes() == line * (per_batch + 2)
    writer.close()
    assert [s.to_json() for s in read_records(steps, StepRecord)[0]] == [record.to_json()] * (
        per_batch + 2
    )


def test_summarize_refuses_a_directory_without_records(tmp_path: Path) -> None:
    from servelab.base.errors import ConfigError

    with pytest.raises(ConfigError, match="pass a run directory"):
        summarize_run(tmp_path)
