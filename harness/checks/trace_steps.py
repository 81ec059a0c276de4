"""What each engine step of a profile window launched, read from its Chrome trace.

`profile.enabled=true` labels every step of its window `engine step N` (`profiling.py`).
This reads the trace back, per labelled step:

- host operators: the aten operators dispatched from Python, counting only the outermost
  (an `aten::linear` calling `aten::matmul` calling `aten::mm` is one dispatch); on a CPU it
  is the launch count's stand-in, and it counts the same on any machine;
- kernels and copies: on a GPU, the device kernels and memory copies whose launch (the
  runtime or driver call with the same correlation id) lies inside the step's span;
- the GPU's busy time: the union of those kernels' and copies' intervals, over the step's
  wall time (a step launched from Python waits on the host between kernels; a CUDA-graph
  replay keeps the GPU busy).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STEP_LABEL = re.compile(r"^engine step (\d+)$")
DEVICE_WORK = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCHES = ("cuda_runtime", "cuda_driver")


@dataclass(frozen=True)
class StepTrace:
    """One labelled step of a profile window."""

    step: int
    wall_s: float  # the step's span on the host
    host_ops: int  # outermost aten operators dispatched
    kernels: int  # device kernels launched within the span (0 on a CPU)
    copies: int  # device memory copies launched within the span (0 on a CPU)
    gpu_busy_s: float  # union of those kernels' and copies' intervals

    @property
    def gpu_busy_share(self) -> float:
        return self.gpu_busy_s / self.wall_s if self.wall_s > 0 else 0.0


def read_trace(path: Path) -> list[StepTrace]:
    """Every labelled step of the Chrome trace at `path`, in step order."""
    events = json.loads(path.read_text())["traceEvents"]
    return step_traces([e for e in events if e.get("ph") == "X"])


def step_traces(events: list[dict[str, Any]]) -> list[StepTrace]:
    spans = sorted(
        (int(found.group(1)), float(e["ts"]), float(e["ts"]) + float(e["dur"]))
        for e in events
        if e.get("cat") == "user_annotation" and (found := STEP_LABEL.match(str(e.get("name"))))
    )
    ops = sorted(
        (
            (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
            for e in events
            if e.get("cat") == "cpu_op" and str(e.get("name", "")).startswith("aten::")
        ),
        key=lambda span: (span[0], -span[1]),  # a parent before the child starting with it
    )
    launched_at = {_correlation(e): float(e["ts"]) for e in events if e.get("cat") in LAUNCHES}
    device = [e for e in events if e.get("cat") in DEVICE_WORK]
    traces = []
    for step, start, end in spans:
        mine = [e for e in device if start <= launched_at.get(_correlation(e), -1.0) <= end]
        traces.append(
            StepTrace(
                step=step,
                wall_s=(end - start) / 1e6,
                host_ops=_outermost(op for op in ops if start <= op[0] and op[1] <= end),
                kernels=sum(e["cat"] == "kernel" for e in mine),
                copies=sum(e["cat"] == "gpu_memcpy" for e in mine),
                gpu_busy_s=_union_s(
                    (float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in mine
                ),
            )
        )
    return traces


def _correlation(event: dict[str, Any]) -> int | None:
    return (event.get("args") or {}).get("correlation")


def _outermost(spans: Iterable[tuple[float, float]]) -> int:
    """Spans sorted by start, a parent before its children: those inside no earlier one."""
    count, reach = 0, float("-inf")
    for start, end in spans:
        if start >= reach:
            count += 1
            reach = end
    return count


def _union_s(intervals: Iterable[tuple[float, float]]) -> float:
    """Length of the union of intervals given in microseconds, in seconds."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total / 1e6
