"""What this machine computes natively, asked once: the one place every dispatch consults.

A kernel that decides for itself ("is AVX-512 there?", "may oneDNN prepack bf16?") is a
kernel nobody tests on the machines it does not decide for; here one probe answers every such
question and one override lowers the answer, so a machine with AVX-512 runs the portable paths
end to end and a test can ask for each level this CPU can run.

Levels, lowest first (x86-64; every other architecture is `baseline`):

- `baseline`: x86-64 as the psABI defines it (SSE2), no AVX2;
- `avx2`: x86-64-v3 (AVX2, FMA, F16C, BMI1/2, LZCNT, MOVBE);
- `avx512`: x86-64-v4 (AVX-512 F, BW, CD, DQ, VL);
- `avx512-bf16`: x86-64-v4 with AVX-512 BF16 and VBMI (vdpbf16ps and byte permutes: the
  fused products, the flash kernel, the int4 loop's fast branch).

`SERVELAB_CPU_ISA` (one of the levels, or `native`) lowers the level; it is read here alone and
recorded in every run's `meta.json`. torch's own kernels are not ours to lower from inside a
process: where they matter (its int4 packing, oneDNN's bf16 products) their answer is probed
here too, and `ATEN_CPU_CAPABILITY` / `ONEDNN_MAX_CPU_ISA` set before start-up lower them.
"""

from __future__ import annotations

import glob
import json
import os
import platform
import shutil
import sys
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path

import torch

from servelab.base.errors import ConfigError

OVERRIDE_ENV = "SERVELAB_CPU_ISA"
LEVELS = ("baseline", "avx2", "avx512", "avx512-bf16")
# /proc/cpuinfo flags each level needs beyond the one below it
LEVEL_FLAGS = {
    "avx2": ("avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "abm", "movbe", "xsave"),
    "avx512": ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"),
    "avx512-bf16": ("avx512_bf16", "avx512vbmi"),
}
# flags reported beside the level (what the hardware has, whatever the level uses)
REPORTED_FLAGS = (
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512dq",
    "avx512_bf16",
    "avx512_fp16",
    "avx512vbmi",
    "avx512_vnni",
    "avx_vnni",
    "avx_ne_convert",
    "amx_tile",
    "amx_bf16",
    "amx_fp16",
)
BF16_HARDWARE_FLAGS = ("avx512_bf16", "amx_bf16")  # a bf16 product in one instruction
FP16_HARDWARE_FLAGS = ("avx512_fp16", "amx_fp16")


def cpu_flags() -> frozenset[str]:
    """The ISA flags the kernel reports for this CPU (empty where /proc/cpuinfo is missing)."""
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists():
        return frozenset()
    for line in cpuinfo.read_text().splitlines():
        if line.startswith(("flags", "Features")):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def native_level(flags: frozenset[str], machine: str) -> str:
    """The highest level whose flags this CPU has (each level needs the ones below it)."""
    if machine not in ("x86_64", "AMD64"):
        return "baseline"
    level = "baseline"
    for name in LEVELS[1:]:
        if not set(LEVEL_FLAGS[name]) <= flags:
            break
        level = name
    return level


def level_at_most(level: str, ceiling: str) -> bool:
    return LEVELS.index(level) <= LEVELS.index(ceiling)


def requested_level(native: str) -> tuple[str, str | None]:
    """(the level dispatch uses, the override as given or None)."""
    value = os.environ.get(OVERRIDE_ENV, "").strip()
    if not value or value == "native":
        return native, value or None
    if value not in LEVELS:
        raise ConfigError(OVERRIDE_ENV, f"{value!r} is not one of: native, {', '.join(LEVELS)}")
    if not level_at_most(value, native):
        raise ConfigError(
            OVERRIDE_ENV,
            f"{value} is above this CPU's level ({native}): it can only lower the level",
        )
    return value, value


def gpu_visible() -> bool:
    """Whether the host shows an NVIDIA GPU (a device node or nvidia-smi), usable or not."""
    return bool(glob.glob("/dev/nvidia[0-9]*")) or shutil.which("nvidia-smi") is not None


@cache
def multiprocessors(device: torch.device, elsewhere: int) -> int:
    """The multiprocessors of a CUDA device, asked once a device (the split kernels size their
    grids by them); `elsewhere` on any other device, where the kernels run interpreted."""
    if device.type != "cuda":
        return elsewhere
    return torch.cuda.get_device_properties(device).multi_processor_count


@dataclass(frozen=True)
class Capabilities:
    """The answers, as `meta.json` records them."""

    machine: str
    native_level: str
    level: str  # what dispatch uses: the native level, or lower by the override
    override: str | None  # SERVELAB_CPU_ISA as set
    flags: dict[str, bool]  # REPORTED_FLAGS present on this CPU
    torch_cpu_capability: str  # the vector ISA torch's own CPU kernels dispatch to
    onednn_bf16: bool  # oneDNN prepacks and multiplies bf16 here (within the level)
    bf16_native: bool  # the CPU multiplies bf16 in hardware (within the level)
    fp16_native: bool  # the same for fp16
    torch_int4_block: int | None  # outputs per block of torch's int4 CPU packing; None: unknown
    cuda: bool
    gpu_visible: bool

    def record(self) -> dict[str, object]:
        return asdict(self)


@cache
def capabilities() -> Capabilities:
    """The probe, once per process (`capabilities.cache_clear()` after changing the override)."""
    machine = platform.machine()
    flags = cpu_flags()
    native = native_level(flags, machine)
    level, override = requested_level(native)
    avx512 = level_at_most("avx512", level)
    return Capabilities(
        machine=machine,
        native_level=native,
        level=level,
        override=override,
        flags={name: name in flags for name in REPORTED_FLAGS},
        torch_cpu_capability=torch.backends.cpu.get_cpu_capability(),
        onednn_bf16=avx512 and _onednn_bf16_supported(),
        bf16_native=level == "avx512-bf16" and any(f in flags for f in BF16_HARDWARE_FLAGS),
        fp16_native=avx512 and any(f in flags for f in FP16_HARDWARE_FLAGS),
        torch_int4_block=torch_int4_block(),
        cuda=torch.cuda.is_available(),
        gpu_visible=gpu_visible(),
    )


def native_levels() -> tuple[str, ...]:
    """Every level this CPU executes, lowest first, whatever the override."""
    native = native_level(cpu_flags(), platform.machine())
    return LEVELS[: LEVELS.index(native) + 1]


def runnable_levels() -> tuple[str, ...]:
    """Every level this CPU runs, lowest first, up to the override where one is set (what the
    kernel tests run each build at)."""
    level, _ = requested_level(native_level(cpu_flags(), platform.machine()))
    return LEVELS[: LEVELS.index(level) + 1]


def _onednn_bf16_supported() -> bool:
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    )


def torch_int4_block(probe_outputs: int = 64) -> int | None:
    """How torch packs int4 weights for its CPU kernel, found by packing a known weight.

    Its layout follows its own vector ISA: with AVX-512, blocks of 64 outputs whose k-th row
    is 32 bytes (byte j: output j in the low nibble, j + 32 in the high); with AVX2 blocks of
    32 (16 bytes, j and j + 16); on other builds an order no loop here reads. The block size,
    or None when the packing is none of these (the int4 loop is then not used).
    """
    if not hasattr(torch.ops.aten, "_convert_weight_to_int4pack_for_cpu"):
        return None
    with torch.device("cpu"):  # asked while a model is built on the meta device, too
        return _packing_block(probe_outputs)


def _packing_block(probe_outputs: int) -> int | None:
    outputs, inner = probe_outputs, 4
    values = (torch.arange(outputs * inner).view(outputs, inner) * 7 + 3) % 16
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(values.to(torch.int32), 2)
    packed = packed.flatten().to(torch.int64)
    for block in (64, 32):
        half = block // 2
        n = torch.arange(outputs).view(outputs // block, 1, block)[..., :half]
        k = torch.arange(inner).view(1, inner, 1)
        low, high = values[n, k], values[n + half, k]
        if torch.equal(packed, (low | (high << 4)).flatten()):
            return block
    return None


def main(argv: list[str]) -> int:
    """`python -m servelab.kernels.capabilities`: the probe as JSON; `--above LEVEL`: exit status
    0 when this CPU's level (the override's, where one is set) is above LEVEL, else 1 (for
    scripts that run a lower level's tests only where that is not the level already)."""
    if argv[:1] == ["--above"] and len(argv) == 2:
        if argv[1] not in LEVELS:
            print(f"unknown level {argv[1]!r}; one of {', '.join(LEVELS)}", file=sys.stderr)
            return 2
        return 0 if not level_at_most(capabilities().level, argv[1]) else 1
    if argv:
        print("usage: python -m servelab.kernels.capabilities [--above LEVEL]", file=sys.stderr)
        return 2
    print(json.dumps(capabilities().record(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
