"""The text report of a workload: counts, statistics, histograms, rate over time, hash."""

from __future__ import annotations

from dataclasses import replace

from servelab.workloads.hashing import workload_hash
from servelab.workloads.show import render_workload
from servelab.workloads.spec import RequestSpec, Workload


def make(arrivals: list[float], concurrency: int | None = None) -> Workload:
    requests = tuple(
        RequestSpec(
            id=str(i),
            prompt_ids=tuple(range(20, 20 + 10 * (i + 1))),
            max_tokens=5 * (i + 1),
            arrival=t,
            excluded=i == 0,
        )
        for i, t in enumerate(arrivals)
    )
    return Workload("demo", requests, workload_hash(requests, concurrency), concurrency)


def test_open_loop_report() -> None:
    workload = make([0.0, 0.5, 1.0, 4.0, 9.0, 10.0])
    text = render_workload(workload, max_context=100)
    lines = text.splitlines()
    assert lines[0] == "workload  demo"
    assert lines[1] == f"hash      {workload.hash}"
    assert lines[2] == "requests  6 (1 excluded as warm-up/cool-down)"
    assert "scheduled duration 10.000 s, mean rate 0.500 req/s" in lines[3]
    assert "tokens    210 prompt, 105 output (max_tokens)" in text
    assert "context   longest request 90 of 100 tokens" in text
    assert "prompt tokens  mean 35.0  std 17.1  min 10  p50 35.0" in text
    top = lines.index("prompt length histogram (tokens)") + 1
    histogram = lines[top : lines.index("", top)]
    assert len(histogram) == 10
    assert [int(line.split()[-1]) for line in histogram] == [1, 0, 1, 0, 1, 1, 0, 1, 0, 1]
    start = lines.index("arrival rate over time (10 buckets of 1.000 s; requests/s, count)")
    buckets = lines[start + 1 : start + 11]
    counts = [int(line.split("(")[-1].rstrip(")")) for line in buckets]
    assert counts == [2, 1, 0, 0, 1, 0, 0, 0, 0, 2]  # [start, end); the last [start, end]
    assert buckets[0].split()[-2] == "2.000"


def test_offline_and_closed_loop_reports() -> None:
    offline = render_workload(make([0.0, 0.0, 0.0]))
    assert "all at t = 0.000 s (offline)" in offline
    assert "arrival rate over time" not in offline and "context" not in offline
    closed = render_workload(make([0.0, 0.0], concurrency=4))
    assert "closed loop, 4 users" in closed


def test_hash_covers_every_sent_field() -> None:
    base = make([0.0, 1.0])
    first = base.requests[0]
    changes: list[dict[str, object]] = [
        {"max_tokens": 6},
        {"arrival": 0.25},
        {"excluded": False},
        {"prompt_ids": (20,)},
        {"seed": 3},
        {"ignore_eos": True},
        {"temperature": 0.5},
        {"top_k": 4},
        {"top_p": 0.5},
        {"id": "other"},
    ]
    rest = base.requests[1:]
    hashes = {workload_hash((replace(first, **change), *rest), None) for change in changes}
    assert len(hashes) == len(changes) and base.hash not in hashes
    assert workload_hash(base.requests, 2) != base.hash
    shown = replace(first, prompt_text="shown only")
    assert workload_hash((shown, *rest), None) == base.hash
