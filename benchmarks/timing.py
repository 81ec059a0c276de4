"""Seconds per call of a kernel or a layer, the one way every benchmark here times one.

A measurement times `calls` calls back to back and divides: on a GPU between two CUDA events
recorded around the loop (one event pair per call would time the launch gaps between
kernels, not the kernels), elsewhere on the wall clock. The result is the median of
`iters` such measurements, after `warmup` untimed calls (Triton compiles, oneDNN builds its
primitives, caches fill).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def time_call(
    fn: Callable[[], object],
    device: torch.device,
    iters: int,
    calls: int = 10,
    warmup: int = 3,
) -> float:
    """Median seconds per call of `fn` on `device`."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(iters):
        if device.type == "cuda":
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3 / calls)
        else:
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            samples.append((time.perf_counter() - t0) / calls)
    return statistics.median(samples)
