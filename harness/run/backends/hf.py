"""`backend=hf_static` and `backend=hf_continuous`: transformers in this process, prepared.

Both load `model` through servelab's loader and run it as transformers' LlamaForCausalLM on
the same tensors (`hf_model`), in `engine.dtype` on `engine.device`, with `engine.seed`.
transformers samples a whole batch with one generator, so both need one sampling setting for
every request of the workload (greedy, as the presets are, or one temperature for all).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import transformers

from servelab.base.errors import ConfigError
from servelab.harness.measure.rundir import RunWriter
from servelab.harness.run.backends.base import (
    Backend,
    PeerInputs,
    check_one_sample,
    peer_inputs,
)
from servelab.harness.run.backends.hf_continuous import ContinuousLimits, ContinuousRunner
from servelab.harness.run.backends.hf_model import transformers_model
from servelab.harness.run.backends.hf_static import replay_static
from servelab.harness.run.build import kv_budget_bytes
from servelab.harness.run.clock import RunClock
from servelab.harness.run.replay import to_request
from servelab.harness.run.settings import EngineSettings
from servelab.models.load import load_model
from servelab.workloads.spec import Workload

if TYPE_CHECKING:
    from servelab.harness.run.spec import RunSpec

PAGE_SIZE = 256  # transformers' default page (block) size, in tokens


def check_one_sampling(workload: Workload, kind: str) -> None:
    def setting(index: int) -> tuple:
        spec = workload.requests[index]
        return (spec.temperature, spec.top_k, spec.top_p, spec.ignore_eos)

    first = setting(0)
    for index in range(1, len(workload.requests)):
        if setting(index) != first:
            raise ConfigError(
                "backend",
                f"{kind} samples a batch one way, but request {workload.requests[index].id} "
                "differs in temperature, top_k, top_p or ignore_eos; use one setting for all",
            )


def continuous_limits(settings: EngineSettings, config: Any) -> ContinuousLimits:
    element = torch.empty((), dtype=settings.dtype).element_size()
    per_token = config.num_layers * config.num_kv_heads * config.head_dim * 2 * element
    blocks = kv_budget_bytes(settings) // (per_token * PAGE_SIZE)
    if blocks < 1:
        raise ConfigError(
            "engine.kv_budget", f"holds less than one page of {PAGE_SIZE} tokens; raise it"
        )
    return ContinuousLimits(
        num_blocks=blocks,
        page_size=PAGE_SIZE,
        max_batch_tokens=settings.max_num_batched_tokens,
        max_requests_per_batch=settings.max_batch_size,
    )


class HFBackend(Backend):
    def __init__(
        self,
        kind: str,
        model: transformers.LlamaForCausalLM,
        settings: EngineSettings,
        limits: ContinuousLimits | None,
        runner: ContinuousRunner | None,
        eos: tuple[int, ...],
        inputs: PeerInputs,
        seeds: dict[str, int],
    ) -> None:
        self.kind = kind
        self.model = model
        self.settings = settings
        self.limits = limits
        self.runner = runner
        self.eos = eos
        self.serves(inputs, settings.device, seeds)

    @classmethod
    def prepare(cls, spec: RunSpec, clock: RunClock, progress: bool) -> HFBackend:
        del clock, progress  # the model loads before the run's clock starts, quietly
        kind = spec.backend
        continuous = kind == "hf_continuous"
        settings = spec.engine_or_fail().settings
        torch.manual_seed(settings.seed)
        loaded = load_model(spec.model, settings.dtype, settings.device)
        inputs = peer_inputs(spec.model, spec.workload, loaded.tokenizer)
        check_one_sampling(inputs.workload, kind)
        check_one_sample(inputs.workload, kind)
        model = transformers_model(loaded)
        eos = loaded.config.eos_token_ids
        limits = runner = None
        if continuous:
            limits = continuous_limits(settings, loaded.config)
            first = to_request(inputs.workload.requests[0], 0)
            runner = ContinuousRunner(model, limits, eos, first)
            runner.start()
        return cls(kind, model, settings, limits, runner, eos, inputs, spec.seeds)

    def describe(self) -> dict[str, Any]:
        limits = asdict(self.limits) if self.limits else {"batch": self.settings.max_batch_size}
        return {
            "strategy": {"name": self.kind, "backend": self.kind},
            "backend": {
                "kind": self.kind,
                "transformers": transformers.__version__,
                "attention": self.model.config._attn_implementation,
                "dtype": str(self.settings.dtype).removeprefix("torch."),
                "weights": "the tensors servelab's loader made for `model`",
                "limits": limits,
                "sampling_seed": "one generator per batch; per-request seeds are not honoured",
            },
        }

    def replay(
        self, clock: Callable[[], float], writer: RunWriter, run_dir: Path, progress: bool
    ) -> None:
        del run_dir
        if self.runner is not None:
            self.runner.replay(self.workload, clock, writer, progress)
            return
        batch = self.settings.max_batch_size
        replay_static(self.model, self.workload, clock, writer, batch, self.eos, progress)
