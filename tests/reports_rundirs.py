"""Synthetic run directories in DESIGN.md's format, for the report tests.

`write_run` lays out config.yaml, meta.json, requests.jsonl, steps.jsonl, telemetry.csv and
summary.json for a made-up run whose numbers follow from its `RunSpec` alone. The summary
is computed here with plain numpy, independently of `reports.derive`, so tests can compare
the reports' numbers with it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

STAT_KEYS = ("mean", "std", "p50", "p90", "p95", "p99")


@dataclass
class RunSpec:
    """What a synthetic run looks like; latencies scale with `slowness` and `rate`."""

    name: str = "run"
    strategy: str = "vllm"
    axes: dict[str, Any] = field(
        default_factory=lambda: {
            "batching": "iteration",
            "kv": "paged",
            "heads": "gqa",
            "weights": "fp32",
            "decoding": "standard",
        }
    )
    workload: str = "chat"
    process: str = "poisson"
    rate: float | None = 2.0
    concurrency: int | None = None
    model: str = "smollm2-135m"
    slo: dict[str, Any] = field(
        default_factory=lambda: {"ttft_s": 0.5, "tpot_s": 0.05, "e2e_s": None}
    )
    num_requests: int = 10
    ttft: float = 0.1
    tpot: float = 0.02
    failed: int = 0
    excluded: int = 0
    preempted: int = 0
    summary: bool = True
    error: str | None = None
    prompt: str = "Summarise the text below."
    extra_summary: dict[str, Any] = field(default_factory=dict)
    roofline: bool = True
    telemetry: bool = True
    truncated_tail: bool = False


def _stats(values: list[float]) -> dict[str, float]:
    array = np.asarray(values, dtype=float)
    if array.size == 0:
        return dict.fromkeys(STAT_KEYS, float("nan"))
    p = np.percentile(array, [50, 90, 95, 99])
    return {
        "mean": float(array.mean()),
        "std": float(array.std()),
        "p50": float(p[0]),
        "p90": float(p[1]),
        "p95": float(p[2]),
        "p99": float(p[3]),
    }


def requests_of(spec: RunSpec) -> list[dict[str, Any]]:
    """The requests.jsonl records: request i sends at i/rate, has 3 + i % 4 output tokens."""
    records = []
    gap = 1.0 / spec.rate if spec.rate else 0.0
    for i in range(spec.num_requests):
        t_scheduled = round(i * gap, 6)
        t_send = t_scheduled + 0.001 * (i % 3)
        outputs = 3 + i % 4
        ttft = spec.ttft * (1 + 0.1 * i)
        tpot = spec.tpot * (1 + 0.05 * (i % 3))
        failed = i >= spec.num_requests - spec.failed
        times = [] if failed else [t_send + ttft + k * tpot for k in range(outputs)]
        records.append(
            {
                "id": f"r{i}",
                "prompt_len": 16 + 4 * i,
                "output_len": len(times),
                "t_scheduled": t_scheduled,
                "t_send": t_send,
                "t_done": times[-1] if times else t_send + ttft,
                "token_times": times,
                "output_ids": list(range(len(times))),
                "finish_reason": "error" if failed else "length",
                "error": "engine error" if failed else None,
                "preemptions": 1 if 0 < i <= spec.preempted else 0,
                "excluded": i < spec.excluded,
                "prompt": f"{spec.prompt} #{i}",
            }
        )
    return records


def summary_of(spec: RunSpec, records: list[dict[str, Any]]) -> dict[str, Any]:
    """The summary.json a correct engine would write for these records."""
    counted = [r for r in records if not r["excluded"]]
    ok = [r for r in counted if r["finish_reason"] == "length"]
    ttft = [r["token_times"][0] - r["t_scheduled"] for r in ok]
    e2e = [r["t_done"] - r["t_scheduled"] for r in ok]
    outputs = [len(r["token_times"]) for r in ok]
    tpot = [
        (r["token_times"][-1] - r["token_times"][0]) / (n - 1)
        for r, n in zip(ok, outputs, strict=True)
        if n > 1
    ]
    itl = [float(g) for r in ok for g in np.diff(r["token_times"])]
    duration = max(r["t_done"] for r in counted) - min(r["t_scheduled"] for r in counted)
    limits = {k: v for k, v in spec.slo.items() if v is not None}
    good = 0
    for record, first, last, n in zip(ok, ttft, e2e, outputs, strict=True):
        times = record["token_times"]
        per_token = (times[-1] - times[0]) / (n - 1) if n > 1 else None
        checks = [
            first <= limits.get("ttft_s", float("inf")),
            last <= limits.get("e2e_s", float("inf")),
            last / n <= limits.get("normalized_latency_s", float("inf")),
            per_token is None or per_token <= limits.get("tpot_s", float("inf")),
        ]
        good += all(checks)
    attainment = good / len(counted)
    summary: dict[str, Any] = {
        "schema": 2,
        "strategy": {"name": spec.strategy, **spec.axes},
        "workload": spec.workload,
        "model": spec.model,
        "status": "failed" if spec.error else "complete",
        "error": spec.error,
        "completed": len(ok),
        "failed": len(counted) - len(ok),
        "duration_s": duration,
        "request_throughput": len(ok) / duration,
        "output_throughput": sum(outputs) / duration,
        "total_throughput": (sum(outputs) + sum(r["prompt_len"] for r in ok)) / duration,
        "goodput": good / duration,
        "slo_attainment": attainment,
        "sustained": attainment >= 0.9 if limits else None,
        "ttft": _stats(ttft),
        "tpot": _stats(tpot),
        "itl": _stats(itl),
        "e2e": _stats(e2e),
        "normalized_latency": _stats([e / n for e, n in zip(e2e, outputs, strict=True)]),
        "kv_waste_mean": 0.25,
        "peak_running": 4,
    }
    summary.update(spec.extra_summary)
    return summary


def steps_of(spec: RunSpec, end: float) -> list[dict[str, Any]]:
    """Steps every 20 ms until `end`, with KV figures and (optionally) roofline counters."""
    steps = []
    for k in range(max(int(end / 0.02), 3)):
        num_seqs = 1 + k % 4
        prefill = 32 if k % 5 == 0 else 0
        allocated = 256 + 16 * (k % 7)
        step: dict[str, Any] = {
            "step": k,
            "t_start": 0.02 * k,
            "t_end": 0.02 * k + 0.018,
            "model_s": 0.015,
            "num_seqs": num_seqs,
            "prefill_tokens": prefill,
            "decode_tokens": num_seqs,
            "waiting": k % 3,
            "running": num_seqs,
            "kv_allocated_slots": allocated,
            "kv_live_slots": allocated - 40,
            "kv_total_slots": 4096,
            "kv_waste": 40 / allocated,
            "preempted": 1 if k == 3 and spec.preempted else 0,
        }
        if spec.roofline:
            step["flops"] = 5e7 * (num_seqs + prefill)
            step["bytes"] = 2.7e8 + 1e6 * prefill
            step["mfu"] = 0.01 * (1 + k % 5)
            step["mbu"] = 0.2 + 0.01 * (k % 5)
        steps.append(step)
    return steps


def write_run(root: Path, spec: RunSpec) -> Path:
    """Write the run directory `root/spec.name` and return its path."""
    run_dir = root / spec.name
    run_dir.mkdir(parents=True, exist_ok=True)
    config = {
        "strategy": {"name": spec.strategy, **spec.axes},
        "workload": {
            "name": spec.workload,
            "num_requests": spec.num_requests,
            "arrival": {
                "process": spec.process,
                "rate": spec.rate,
                "concurrency": spec.concurrency,
            },
        },
        "engine": {"device": "cpu", "max_num_seqs": 8},
        "model": {"name": spec.model, "dtype": "fp32"},
        "slo": spec.slo,
    }
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    meta = {
        "versions": {"torch": "2.13.0", "python": "3.11"},
        "device": "cpu",
        "cpu_model": "synthetic CPU",
        "git_commit": "0123abc",
        "peaks": {"matmul_flops_per_s": 2.0e11, "copy_bytes_per_s": 2.0e10},
    }
    (run_dir / "meta.json").write_text(json.dumps(meta))
    records = requests_of(spec)
    lines = [json.dumps(r) for r in records]
    if spec.truncated_tail:
        lines.append(lines[-1][: len(lines[-1]) // 2])
    (run_dir / "requests.jsonl").write_text("\n".join(lines) + "\n")
    end = max((r["token_times"][-1] for r in records if r["token_times"]), default=0.1)
    steps = steps_of(spec, end)
    (run_dir / "steps.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    if spec.telemetry:
        rows = ["t,cpu_pct,rss_mib,power_w,energy_j"]
        rows += [f"{0.1 * k:.1f},{50 + k % 10},{100 + k},{30 + k % 4},{3.0 * k}" for k in range(20)]
        (run_dir / "telemetry.csv").write_text("\n".join(rows) + "\n")
    if spec.summary:
        summary = summary_of(spec, records)
        (run_dir / "summary.json").write_text(json.dumps(summary))
    return run_dir


def page_text(path: Path) -> str:
    """A generated page's HTML with table cells' classes dropped, to match cells simply."""
    return path.read_text().replace('<td class="t">', "<td>")
