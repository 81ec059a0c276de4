"""The reproducibility record of a run (meta.json): exactly what machine and software made it.

A number is only worth comparing if one can tell what produced it. This gathers the
versions of the software stack (the git commit and dirty flag of the checkout the code runs
from, and which dependency lock the install matches), the device (GPU name, driver, CUDA,
clocks and power limit at the start through NVML; the CPU model, cores and the
instruction-set flags that decide matrix speed), the host, the start time, the model file's
hash, the workload's hash, the seeds and the resolved config. Every probe is optional: a
missing git, NVML or /proc leaves its fields None, never an exception.
"""

from __future__ import annotations

import os
import platform
import socket
import subprocess
from collections.abc import Callable
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pynvml
import torch

from servelab.harness.checks.lock import lock_record
from servelab.harness.measure.telemetry import nvml_device_handle

META_SCHEMA = 1
CPU_FLAGS_OF_INTEREST = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "avx_vnni",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "asimd",
    "asimddp",
    "bf16",
    "i8mm",
    "sve",
    "sve2",
)
ENV_OF_INTEREST = (
    "CUDA_VISIBLE_DEVICES",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "TRITON_INTERPRET",
    "HF_HUB_OFFLINE",
    "SERVELAB_CPU_ISA",
    "ATEN_CPU_CAPABILITY",
    "ONEDNN_MAX_CPU_ISA",
)
VERSIONS_OF_INTEREST = ("triton", "transformers", "numpy", "hydra-core", "gguf")
REPO_ROOT = Path(__file__).resolve().parents[2]
GIB = 1024**3

T = TypeVar("T")


def _cpuinfo() -> dict[str, str]:
    """The first value of each key in /proc/cpuinfo, or nothing where there is no such file."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    info: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            info.setdefault(key.strip(), value.strip())
    return info


def cpu_model_name() -> str:
    """The CPU's marketing name where the OS tells it, else the architecture."""
    info = _cpuinfo()
    for key in ("model name", "Model", "Hardware"):
        if info.get(key):
            return info[key]
    return platform.processor() or platform.machine() or "unknown CPU"


def cpu_info() -> dict[str, Any]:
    """CPU model, cores, the threads torch uses, and the matrix-relevant ISA flags present."""
    info = _cpuinfo()
    flags = set((info.get("flags") or info.get("Features") or "").split())
    return {
        "model": cpu_model_name(),
        "physical_cores": psutil.cpu_count(logical=False),
        "logical_cores": psutil.cpu_count(logical=True),
        "torch_threads": torch.get_num_threads(),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "flags": [flag for flag in CPU_FLAGS_OF_INTEREST if flag in flags],
        "memory_total_gib": round(psutil.virtual_memory().total / GIB, 2),
    }


def _nvml_value(read: Callable[[], T]) -> T | None:
    try:
        return read()
    except pynvml.NVMLError:
        return None


def _text(value: str | bytes | None) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def _cuda_version(code: int | None) -> str | None:
    """NVML spells CUDA 12.4 as 12040."""
    return None if code is None else f"{code // 1000}.{code % 1000 // 10}"


def nvml_info(device: torch.device) -> dict[str, Any]:
    """Driver, CUDA driver version, clocks and power limit at the start, as NVML reports them."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        return {"error": f"NVML did not start: {err}"}
    try:
        handle = nvml_device_handle(device)
        mw = _nvml_value(lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(handle))
        return {
            "name": _text(_nvml_value(lambda: pynvml.nvmlDeviceGetName(handle))),
            "driver": _text(_nvml_value(pynvml.nvmlSystemGetDriverVersion)),
            "cuda_driver": _cuda_version(_nvml_value(pynvml.nvmlSystemGetCudaDriverVersion)),
            "sm_clock_mhz": _nvml_value(
                lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)
            ),
            "mem_clock_mhz": _nvml_value(
                lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM)
            ),
            "sm_clock_max_mhz": _nvml_value(
                lambda: pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM)
            ),
            "mem_clock_max_mhz": _nvml_value(
                lambda: pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM)
            ),
            "power_limit_w": None if mw is None else mw / 1000.0,
        }
    except pynvml.NVMLError as err:
        return {"error": f"NVML found no handle for {device}: {err}"}
    finally:
        pynvml.nvmlShutdown()


def gpu_info(device: torch.device) -> dict[str, Any]:
    """What torch knows about the GPU, plus NVML's view of driver, clocks and power."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    return {
        "name": props.name,
        "index": index,
        "capability": f"{props.major}.{props.minor}",
        "multiprocessors": props.multi_processor_count,
        "memory_total_gib": round(props.total_memory / GIB, 2),
        "torch_cuda": torch.version.cuda,
        "nvml": nvml_info(device),
    }


def device_info(device: torch.device) -> dict[str, Any]:
    """The run device; the host CPU is always included, since it drives the engine loop."""
    info: dict[str, Any] = {"type": device.type, "cpu": cpu_info(), "gpu": None}
    if device.type == "cuda" and torch.cuda.is_available():
        info["gpu"] = gpu_info(device)
    return info


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(REPO_ROOT), *args],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


def git_state() -> tuple[str | None, bool | None]:
    """(commit, dirty) of the checkout this code runs from; (None, None) outside one."""
    top = _git("rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != REPO_ROOT:
        return None, None
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain")
    return commit, None if status is None else bool(status)


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, Any]:
    """The software stack a figure depends on, and which dependency lock the install matches."""
    commit, dirty = git_state()
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        **{package: _version(package) for package in VERSIONS_OF_INTEREST},
        "servelab": _version("servelab"),
        "git_commit": commit,
        "git_dirty": dirty,
        "lock": lock_record(REPO_ROOT),
    }


def collect_meta(
    resolved_config: dict,
    model_file: Path | None,
    model_sha256: str | None,
    workload_hash: str,
    seeds: dict[str, int],
    device: torch.device,
) -> dict:
    """Everything meta.json holds, as plain JSON-serialisable values."""
    return {
        "schema": META_SCHEMA,
        "started_at": datetime.now(UTC).astimezone().isoformat(),
        "host": {
            "hostname": socket.gethostname(),
            "platform": platform.platform(),
        },
        "versions": versions(),
        "device": device_info(device),
        "env": {name: os.environ.get(name) for name in ENV_OF_INTEREST},
        "model": {
            "file": None if model_file is None else str(model_file),
            "sha256": model_sha256,
        },
        "workload_hash": workload_hash,
        "seeds": dict(seeds),
        "config": resolved_config,
    }
