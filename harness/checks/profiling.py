"""An opt-in torch.profiler window over a few engine steps (`profile.enabled=true`).

Profiling a whole run would slow it and drown the trace; a window of steps after warm-up
shows where a step's time goes (matrix products, attention, cache writes, Python
bookkeeping). The engine reports each step's start and end; the profiler starts at
`first_step`, labels every step in the trace, stops after `num_steps` steps and writes a
Chrome trace (open it in chrome://tracing or Perfetto) into the run directory, and beside it
`profile.json`: each step of the window with its batch and what the trace says it launched
(`trace_steps.py`: host operators, kernels and copies, the GPU's busy share).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from servelab.base.errors import ConfigError
from servelab.base.records import step_kind
from servelab.engine.step_update import StepResult
from servelab.harness.checks.trace_steps import read_trace

TRACE_NAME = "profile_trace.json"
SUMMARY_NAME = "profile.json"


class StepProfiler:
    """torch.profiler over a window of engine steps, writing a Chrome trace into the run dir."""

    def __init__(self, enabled: bool, first_step: int, num_steps: int, out_dir: Path) -> None:
        if enabled and first_step < 0:
            raise ConfigError("profile.first_step", f"must be 0 or more, got {first_step}")
        if enabled and num_steps < 1:
            raise ConfigError("profile.num_steps", f"must be 1 or more, got {num_steps}")
        self._enabled = enabled
        self._first_step = first_step
        self._last_step = first_step + num_steps - 1
        self._out_dir = out_dir
        self._profiler: profile | None = None
        self._step_label: record_function | None = None
        self._trace: Path | None = None
        self._done = False
        self._batches: dict[int, dict[str, object]] = {}

    def step_started(self, step: int) -> None:
        """Start the profiler at the window's first step, and label every step inside it."""
        if not self._enabled or self._done or step < self._first_step:
            return
        if self._profiler is None:
            activities = [ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(ProfilerActivity.CUDA)
            self._profiler = profile(activities=activities, record_shapes=True)
            self._profiler.start()
        self._step_label = record_function(f"engine step {step}")
        self._step_label.__enter__()

    def step_finished(self, result: StepResult) -> None:
        """Close the step's label; after the window's last step, stop and write the trace."""
        if self._step_label is not None:
            self._step_label.__exit__(None, None, None)
            self._step_label = None
            record = result.record
            self._batches[record.step] = {
                "kind": step_kind(record),
                "num_seqs": record.num_seqs,
                "prefill_tokens": record.prefill_tokens,
                "decode_tokens": record.decode_tokens,
            }
        if self._profiler is not None and result.record.step >= self._last_step:
            self._finish()

    def close(self) -> Path | None:
        """Stop a window the run ended inside, and say where the trace is (None if none was)."""
        if self._step_label is not None:
            self._step_label.__exit__(None, None, None)
            self._step_label = None
        if self._profiler is not None:
            self._finish()
        return self._trace

    def _finish(self) -> None:
        assert self._profiler is not None
        self._profiler.stop()
        self._out_dir.mkdir(parents=True, exist_ok=True)
        self._trace = self._out_dir / TRACE_NAME
        self._profiler.export_chrome_trace(str(self._trace))
        self._profiler = None
        self._done = True
        steps = [
            {
                **self._batches.get(trace.step, {}),
                **asdict(trace),
                "gpu_busy_share": trace.gpu_busy_share,
            }
            for trace in read_trace(self._trace)
        ]
        summary = {"trace": TRACE_NAME, "steps": steps}
        (self._out_dir / SUMMARY_NAME).write_text(json.dumps(summary, indent=1) + "\n")
