"""The interface `run()` measures every backend through, and what the peers share.

A backend is prepared before the clock starts (every input checked, the model loaded or the
endpoint reached), then replays its workload in real time, writing one `RequestRecord` per
request through the run writer; `run()` does the rest identically for all of them: config,
meta.json, telemetry, summary, report.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from servelab.base.errors import ConfigError
from servelab.harness.measure.flags import Flag
from servelab.harness.measure.rundir import RunRecords, RunWriter
from servelab.harness.run.clock import RunClock
from servelab.models.load import (
    checkpoint_id,
    model_config_of,
    resolve_model_path,
    tokenizer_for,
)
from servelab.models.model import ModelConfig
from servelab.models.spec import ModelSpec
from servelab.workloads.build import build_workload
from servelab.workloads.config import WorkloadConfig
from servelab.workloads.spec import Workload


class Backend(ABC):
    workload: Workload
    device: torch.device  # where it runs (what meta.json describes; telemetry samples it)
    model_file: Path | None  # the model file behind the tokenizer (and weights, in process)
    model_sha256: str | None
    seeds: dict[str, int]
    no_telemetry: str | None = None  # why the run samples no telemetry (None: it does)

    def serves(self, inputs: PeerInputs, device: torch.device, seeds: dict[str, int]) -> None:
        """What a peer serves, as meta.json describes it: the workload, the model file behind
        its tokenizer, where it runs and the seeds."""
        self.workload, self.device, self.seeds = inputs.workload, device, seeds
        self.model_file, self.model_sha256 = inputs.model_file, inputs.model_sha256

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """meta.json entries: `strategy` (a `name` for reports, and what it stands for), and
        whatever else says what was measured."""

    @abstractmethod
    def replay(self, clock: RunClock, writer: RunWriter, run_dir: Path, progress: bool) -> None:
        """Serve every request of the workload at its arrival, writing each record."""

    def flags(self, records: RunRecords) -> list[Flag]:
        """After the run, from its records: what makes its figures doubtful, beyond the
        generic flags."""
        del records
        return []


@dataclass
class PeerInputs:
    """What every peer backend starts from: the same workload an in-process run would send."""

    workload: Workload
    tokenizer: PreTrainedTokenizerBase
    model_file: Path | None
    model_sha256: str | None
    model_config: ModelConfig  # the model's shape and context, as its file or shape says


def peer_inputs(
    model: ModelSpec,
    workload_config: WorkloadConfig,
    tokenizer: PreTrainedTokenizerBase | None = None,
) -> PeerInputs:
    """The workload, tokenised by `model`'s tokenizer within its context, and its model file."""
    path = resolve_model_path(model)
    tokenizer = tokenizer or tokenizer_for(model)
    config = model_config_of(model)
    workload = build_workload(workload_config, tokenizer, config.max_context)
    sha = checkpoint_id(model, path) if path is not None and path.is_file() else None
    return PeerInputs(workload, tokenizer, path, sha, config)


def check_one_sample(workload: Workload, kind: str) -> None:
    """A peer that serves one sample per request refuses a workload asking for more."""
    if any(spec.n > 1 for spec in workload.requests):
        raise ConfigError(
            "workload.sampling.n",
            f"{kind} is measured one sample per request; run n > 1 samples on the engine",
        )
