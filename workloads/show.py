"""A workload described as text, for `servelab workload show` (no model is loaded).

It prints what a reader needs to trust a load before running it: how many requests, how
long their prompts and outputs are (statistics and histograms), when they arrive (the
rate per time bucket), how many are excluded, whether they fit the context, and the hash.
"""

from __future__ import annotations

import numpy as np

from servelab.workloads.spec import Workload

BAR_WIDTH = 40
BINS = 10
PERCENTILES = (50, 90, 99)


def render_workload(workload: Workload, max_context: int | None = None) -> str:
    """The text report of one workload."""
    requests = workload.requests
    prompts = np.asarray([len(r.prompt_ids) for r in requests], dtype=np.int64)
    outputs = np.asarray([r.max_tokens for r in requests], dtype=np.int64)
    arrivals = np.asarray([r.arrival for r in requests], dtype=np.float64)
    excluded = sum(r.excluded for r in requests)
    lines = [
        f"workload  {workload.name}",
        f"hash      {workload.hash}",
        f"requests  {len(requests)} ({excluded} excluded as warm-up/cool-down)",
        f"schedule  {_schedule(workload, arrivals)}",
        f"sampling  {_sampling(workload)}",
        f"tokens    {int(prompts.sum())} prompt, {int(outputs.sum())} output (max_tokens)",
    ]
    if max_context is not None:
        longest = int((prompts + outputs).max())
        lines.append(f"context   longest request {longest} of {max_context} tokens")
    lines += ["", _stats("prompt tokens", prompts), _stats("output tokens", outputs)]
    lines += ["", "prompt length histogram (tokens)", *_histogram(prompts)]
    lines += ["", "output length histogram (max_tokens)", *_histogram(outputs)]
    if workload.concurrency is None and arrivals[-1] > arrivals[0]:
        lines += ["", *_rate_over_time(arrivals)]
    return "\n".join(lines)


def _schedule(workload: Workload, arrivals: np.ndarray) -> str:
    if workload.concurrency is not None:
        return f"closed loop, {workload.concurrency} users (next request when one finishes)"
    span = float(arrivals[-1] - arrivals[0])
    if span == 0:
        return f"all at t = {arrivals[0]:.3f} s (offline)"
    rate = (len(arrivals) - 1) / span
    return (
        f"open loop, t = {arrivals[0]:.3f} .. {arrivals[-1]:.3f} s "
        f"(scheduled duration {span:.3f} s, mean rate {rate:.3f} req/s)"
    )


def _sampling(workload: Workload) -> str:
    first = workload.requests[0]
    mode = "greedy" if first.temperature == 0 else f"temperature {first.temperature}"
    samples = f", {first.n} samples per prompt" if first.n > 1 else ""
    return (
        f"{mode}, top_k {first.top_k}, top_p {first.top_p}, ignore_eos {first.ignore_eos}{samples}"
    )


def _stats(label: str, values: np.ndarray) -> str:
    marks = np.percentile(values, PERCENTILES)
    cuts = "  ".join(f"p{p} {v:.1f}" for p, v in zip(PERCENTILES, marks, strict=True))
    return (
        f"{label:<14} mean {values.mean():.1f}  std {values.std():.1f}  min {values.min()}  "
        f"{cuts}  max {values.max()}"
    )


def _bar(count: int, most: int) -> str:
    return "#" * (round(BAR_WIDTH * count / most) if most else 0)


def _histogram(values: np.ndarray) -> list[str]:
    low, high = int(values.min()), int(values.max()) + 1
    edges = np.unique(np.linspace(low, high, BINS + 1).round().astype(np.int64))
    counts, _ = np.histogram(values, bins=edges)
    most = int(counts.max())
    return [
        f"{int(lo):>7} - {int(hi) - 1:>7} | {_bar(int(n), most):<{BAR_WIDTH}} {int(n)}"
        for lo, hi, n in zip(edges[:-1], edges[1:], counts, strict=True)
    ]


def _rate_over_time(arrivals: np.ndarray) -> list[str]:
    start, end = float(arrivals[0]), float(arrivals[-1])
    width = (end - start) / BINS
    counts, edges = np.histogram(arrivals, bins=BINS, range=(start, end))
    most = int(counts.max())
    lines = [f"arrival rate over time ({BINS} buckets of {width:.3f} s; requests/s, count)"]
    for lo, hi, n in zip(edges[:-1], edges[1:], counts, strict=True):
        rate = int(n) / width
        lines.append(
            f"{lo:>9.2f} - {hi:>9.2f} s | {_bar(int(n), most):<{BAR_WIDTH}} {rate:.3f}  ({int(n)})"
        )
    return lines
