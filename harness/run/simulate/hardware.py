"""A step's time derived from a hardware description, for machines not at hand.

A step takes a fixed overhead plus the longer of its compute and its memory traffic, the
roofline: FLOPs over the peak times a compute efficiency, bytes over the bandwidth times a
bandwidth efficiency. The work is `harness.measure.roofline`'s count of the step (every
linear layer, causal attention's pairs, the LM head's rows; the weights read once, the KV
read and written, the activations), so a derived step and a measured step's MFU/MBU use one
definition. The presets' peaks are the vendors' published dense bf16 tensor figures and
memory bandwidths; the efficiencies are assumptions, stated with every plan, not
measurements. A prediction from them is labelled as such wherever it is shown.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from servelab.base.errors import ConfigError
from servelab.harness.measure.roofline import ModelShape, work_of_counts
from servelab.harness.run.simulate.cost_model import StepCounts

COMPUTE_EFFICIENCY = 0.5  # of peak FLOP/s a serving step's matrix products reach
BANDWIDTH_EFFICIENCY = 0.8  # of peak bandwidth a step's weight and KV reads reach
STEP_OVERHEAD_S = 0.002  # launches, scheduling and sampling per step (no CUDA graphs)
USABLE_MEMORY = 0.9  # of device memory for weights and KV, as vLLM's gpu_memory_utilization


@dataclass(frozen=True)
class Hardware:
    name: str
    peak_flops: float  # dense bf16 FLOP/s
    bandwidth: float  # bytes/s
    memory_bytes: float
    source: str  # where the figures come from
    marks: tuple[str, ...]  # the words of a device's name (torch's) that identify it


PRESETS = {
    "a100-40gb": Hardware(
        "NVIDIA A100 40GB SXM", 312e12, 1.555e12, 40e9,
        "NVIDIA A100 datasheet: 312 TFLOPS bf16 dense, 1,555 GB/s HBM2", ("A100", "40GB"),
    ),
    "a100-80gb": Hardware(
        "NVIDIA A100 80GB SXM", 312e12, 2.039e12, 80e9,
        "NVIDIA A100 datasheet: 312 TFLOPS bf16 dense, 2,039 GB/s HBM2e", ("A100", "80GB"),
    ),
    "h100-80gb": Hardware(
        "NVIDIA H100 SXM 80GB", 989e12, 3.35e12, 80e9,
        "NVIDIA H100 datasheet: 989 TFLOPS bf16 dense, 3.35 TB/s HBM3", ("H100",),
    ),
    "h200": Hardware(
        "NVIDIA H200 SXM 141GB", 989e12, 4.8e12, 141e9,
        "NVIDIA H200 datasheet: 989 TFLOPS bf16 dense, 4.8 TB/s HBM3e", ("H200",),
    ),
    "l4": Hardware(
        "NVIDIA L4 24GB", 121e12, 300e9, 24e9,
        "NVIDIA L4 datasheet: 121 TFLOPS bf16 dense, 300 GB/s GDDR6", ("L4",),
    ),
}  # fmt: skip


def hardware_preset(name: str, field: str = "simulate.hardware") -> Hardware:
    if name not in PRESETS:
        raise ConfigError(field, f"{name!r} is not one of: {', '.join(PRESETS)}")
    return PRESETS[name]


def preset_of_device(device_name: str) -> str | None:
    """The preset a device is, by the words of its name ("NVIDIA A100-SXM4-80GB" is
    a100-80gb, "NVIDIA L40S" no preset); None for none."""
    words = set(re.split(r"[^A-Z0-9]+", device_name.upper()))
    return next((key for key, h in PRESETS.items() if set(h.marks) <= words), None)


@dataclass(frozen=True)
class RooflineStepTime:
    """Each step's time on `hardware` for a model of `shape` (see the module docstring)."""

    hardware: Hardware
    shape: ModelShape
    weight_bytes: float
    element_bytes: float  # of weights' activations and of the KV cache
    kv_heads: int  # heads the KV cache stores
    compute_efficiency: float = COMPUTE_EFFICIENCY
    bandwidth_efficiency: float = BANDWIDTH_EFFICIENCY
    step_overhead_s: float = STEP_OVERHEAD_S
    gap_s: float = 0.0

    def step_seconds(self, counts: StepCounts) -> float:
        work = work_of_counts(
            self.shape, self.weight_bytes, counts.tokens, counts.attended_pairs,
            counts.context_tokens, counts.logits_rows, self.element_bytes,
            self.element_bytes, self.kv_heads,
        )  # fmt: skip
        compute_s = work.flops / (self.hardware.peak_flops * self.compute_efficiency)
        memory_s = work.bytes / (self.hardware.bandwidth * self.bandwidth_efficiency)
        return self.step_overhead_s + max(compute_s, memory_s)

    def record(self) -> dict:
        """What a run and a plan say the prediction rests on."""
        return {
            "hardware": asdict(self.hardware),
            "compute_efficiency": self.compute_efficiency,
            "bandwidth_efficiency": self.bandwidth_efficiency,
            "step_overhead_s": self.step_overhead_s,
            "weight_bytes": self.weight_bytes,
        }
