"""Measured peaks of this machine: the denominators of MFU and MBU (`servelab calibrate`).

A datasheet peak is rarely reachable, and on a shared CPU it is meaningless, so the
roofline divides by what this machine actually does: a large matrix product in the run
dtype (FLOP/s) and a large memory copy (bytes read plus written per second). Each is timed
several times and the best run kept, since interference only ever slows a run down. The
result is cached as json per host, device name and dtype, so runs reuse one measurement
and a change of machine or thread count measures afresh. For the same reason the cache keeps
the best figure ever measured for each peak: a refresh raises a cached peak, never lowers
it, and each figure keeps when it was measured and the CPU's load average just before
(peaks measured while other work shared the CPU read low, and would make MFU read high; the
calibrate table says so). A run whose own steps beat a cached peak asks for a new
measurement (`remeasure_if_beaten`). On CUDA the timing uses CUDA
events; an fp32 product there runs under whatever TF32 setting the process has chosen.
"""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime
from pathlib import Path

import psutil
import torch

from servelab.base.errors import ConfigError
from servelab.harness.measure.meta import cpu_model_name
from servelab.kernels.cpu_build import cpu_ops

DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.float32: "float32",
    torch.bfloat16: "bfloat16",
    torch.float16: "float16",
}
MIB = 1024 * 1024


@dataclass(frozen=True)
class Peaks:
    """The best this machine did at the two things a model step is made of."""

    matmul_flops_per_s: float  # a large matrix product in the run dtype
    copy_bytes_per_s: float  # a large memory copy (bytes read + written per second)
    device: str
    dtype: str
    host: str


@dataclass(frozen=True)
class Budget:
    """How big the measured operations are and how long to keep repeating them."""

    matmul_n: int  # square matrix side
    copy_bytes: int  # size of the copied buffer
    min_repeats: int
    max_repeats: int
    seconds: float  # keep repeating until this much time is spent (after min_repeats)


CPU_BUDGET = Budget(
    matmul_n=2048, copy_bytes=256 * MIB, min_repeats=3, max_repeats=100, seconds=3.0
)
CUDA_BUDGET = Budget(
    matmul_n=8192, copy_bytes=2048 * MIB, min_repeats=10, max_repeats=1000, seconds=1.0
)


def device_name(device: torch.device) -> str:
    """What the peaks belong to: the GPU's name, or the CPU model and the threads torch uses."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{cpu_model_name()} ({torch.get_num_threads()} threads)"


def _check(device: torch.device, dtype: torch.dtype) -> tuple[str, Budget]:
    if dtype not in DTYPE_NAMES:
        raise ConfigError(
            "calibrate.dtype", f"{dtype} is not measured; use one of {sorted(DTYPE_NAMES.values())}"
        )
    if device.type == "cpu":
        return DTYPE_NAMES[dtype], CPU_BUDGET
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("device", "CUDA was asked for but torch sees no GPU; use device=cpu")
        return DTYPE_NAMES[dtype], CUDA_BUDGET
    raise ConfigError("device", f"cannot calibrate {device.type}; use cpu or cuda")


def best_seconds(fn: Callable[[], object], device: torch.device, budget: Budget) -> float:
    """The fastest of repeated timed calls of `fn` after one warm-up call."""
    fn()
    timings: list[float] = []
    spent = 0.0
    while len(timings) < budget.max_repeats and (
        len(timings) < budget.min_repeats or spent < budget.seconds
    ):
        seconds = _time_cuda(fn) if device.type == "cuda" else _time_cpu(fn)
        timings.append(seconds)
        spent += seconds
    return min(timings)


def _time_cpu(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _time_cuda(fn: Callable[[], object]) -> float:
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1000.0


PROBE_N = 256  # the side of the product that sizes the measured one
MAX_PRODUCT_S = 0.5  # the measured product is made smaller than budget.matmul_n to stay under


def matmul_side(device: torch.device, dtype: torch.dtype, budget: Budget) -> int:
    """The side of the measured product: `budget.matmul_n`, or smaller (a multiple of 64, at
    least PROBE_N unless the budget's is smaller) where one product that size would take over
    MAX_PRODUCT_S. A CPU without native bf16 multiplies it at a fraction of a GFLOP/s (0.28 on
    an AVX2-only Zen 3): a 2048-side product there took a minute, and calibration several."""
    a = torch.randn(PROBE_N, PROBE_N, device=device, dtype=dtype)
    torch.matmul(a, a)
    probe = _time_cuda if device.type == "cuda" else _time_cpu
    rate = 2.0 * PROBE_N**3 / probe(lambda: torch.matmul(a, a))
    affordable = int((rate * MAX_PRODUCT_S / 2.0) ** (1 / 3)) // 64 * 64
    return max(min(PROBE_N, budget.matmul_n), min(budget.matmul_n, affordable))


def measure_matmul_flops(device: torch.device, dtype: torch.dtype, budget: Budget) -> float:
    """FLOP/s of a square matrix product in `dtype` (side `matmul_side`): torch's, or on a CPU
    in fp32 the faster of torch's and the compiled panel product the fp32 linears run on
    (`kernels/cpu/panel_gemm_f32.cpp`), which beat torch's (MKL's) peak by up to a fifth; a
    denominator below what the steps reach made every fp32 run's MFU read high."""
    n = matmul_side(device, dtype, budget)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    seconds = best_seconds(lambda: torch.matmul(a, b, out=out), device, budget)
    ops = cpu_ops() if device.type == "cpu" and dtype == torch.float32 else None
    if ops is not None:
        panels = ops.pack_panels_f32(b)
        panel_seconds = best_seconds(lambda: ops.panel_linear_f32(a, panels, n), device, budget)
        seconds = min(seconds, panel_seconds)
    return 2.0 * n**3 / seconds


def measure_copy_bytes(device: torch.device, dtype: torch.dtype, budget: Budget) -> float:
    """Bytes read plus written per second copying a `budget.copy_bytes` buffer of `dtype`."""
    numel = budget.copy_bytes // torch.empty((), dtype=dtype).element_size()
    src = torch.ones(numel, device=device, dtype=dtype)
    dst = torch.zeros(numel, device=device, dtype=dtype)
    seconds = best_seconds(lambda: dst.copy_(src), device, budget)
    return 2.0 * numel * src.element_size() / seconds


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()


def cache_path(cache_dir: Path, host: str, device: str, dtype: str) -> Path:
    """Where the peaks of one host, device and dtype are kept."""
    return cache_dir / f"peaks-{_slug(host)}-{_slug(device)}-{dtype}.json"


def _load(path: Path, expected: dict[str, str]) -> Peaks | None:
    """Cached peaks if the file holds a complete record for this host, device and dtype."""
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))["peaks"]
        peaks = Peaks(**{f.name: stored[f.name] for f in fields(Peaks)})
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if any(getattr(peaks, key) != value for key, value in expected.items()):
        return None
    return peaks


PEAK_KEYS = ("matmul_flops_per_s", "copy_bytes_per_s")


def _save(path: Path, peaks: Peaks, budget: Budget, load_average: float) -> Peaks:
    """Merge a new measurement into the cache, keeping the best of each peak; the result."""
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        old = {}
    cached = _load(path, {"host": peaks.host, "device": peaks.device, "dtype": peaks.dtype})
    when = {"measured_at": datetime.now(UTC).isoformat(), "load_average_1m": load_average}
    best = asdict(peaks)
    measured = {key: dict(when) for key in PEAK_KEYS}
    for key in PEAK_KEYS:
        if cached is not None and getattr(cached, key) >= best[key]:
            best[key] = getattr(cached, key)
            measured[key] = old.get("measured", {}).get(key, old_when(old))
    record = {
        "peaks": best,
        "measured": measured,
        "torch": torch.__version__,
        "budget": asdict(budget),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)
    return Peaks(**best)


def old_when(record: dict) -> dict:
    """When a cache file written before per-peak dates was measured."""
    return {
        "measured_at": record.get("measured_at"),
        "load_average_1m": record.get("load_average_1m"),
    }


def measure_peaks(
    device: torch.device, dtype: torch.dtype, cache_dir: Path, refresh: bool = False
) -> Peaks:
    """This machine's best matmul and copy peaks for `dtype`: the cache's, unless it has none
    or `refresh` asks for a new measurement (which only ever raises them)."""
    dtype_name, budget = _check(device, dtype)
    host = socket.gethostname()
    name = device_name(device)
    path = cache_path(cache_dir, host, name, dtype_name)
    if not refresh:
        cached = _load(path, {"host": host, "device": name, "dtype": dtype_name})
        if cached is not None:
            return cached
    load_average = psutil.getloadavg()[0]
    peaks = Peaks(
        matmul_flops_per_s=measure_matmul_flops(device, dtype, budget),
        copy_bytes_per_s=measure_copy_bytes(device, dtype, budget),
        device=name,
        dtype=dtype_name,
        host=host,
    )
    return _save(path, peaks, budget, load_average)


def provenance(cache_dir: Path, peaks: Peaks) -> dict[str, dict]:
    """For each peak, when it was measured and the load average just before."""
    path = cache_path(cache_dir, peaks.host, peaks.device, peaks.dtype)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    measured = record.get("measured") or {key: old_when(record) for key in PEAK_KEYS}
    return {key: dict(measured.get(key) or {}) for key in PEAK_KEYS}


def measured_load(cache_dir: Path, peaks: Peaks) -> float | None:
    """The highest 1-minute load average just before either peak was measured."""
    loads = [
        entry.get("load_average_1m") for entry in provenance(cache_dir, peaks).values() if entry
    ]
    loads = [float(load) for load in loads if isinstance(load, int | float)]
    return max(loads) if loads else None


def remeasure_if_beaten(
    device: torch.device,
    dtype: torch.dtype,
    cache_dir: Path,
    peaks: Peaks,
    achieved_flops_per_s: float,
    achieved_bytes_per_s: float,
) -> Peaks | None:
    """Measure again when a run achieved more than a cached peak; the new best peaks, or None
    when the run stayed under them."""
    if (
        achieved_flops_per_s <= peaks.matmul_flops_per_s
        and achieved_bytes_per_s <= peaks.copy_bytes_per_s
    ):
        return None
    return measure_peaks(device, dtype, cache_dir, refresh=True)


def format_rate(value: float, unit: str) -> str:
    """A rate with three significant figures and an SI prefix: 53.7 GFLOP/s, 4.35 TB/s."""
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def calibrate_main(
    device: torch.device, dtypes: list[torch.dtype], cache_dir: Path, refresh: bool
) -> str:
    """Measure (or read back) the peaks for each dtype and return a printable table."""
    if not dtypes:
        raise ConfigError("calibrate.dtypes", "name at least one dtype, e.g. [float32, bfloat16]")
    for dtype in dtypes:
        _check(device, dtype)
    rows = [measure_peaks(device, dtype, cache_dir, refresh) for dtype in dtypes]
    loads = [measured_load(cache_dir, peaks) for peaks in rows]
    header = f"{'dtype':<10} {'matmul':>16} {'copy':>14} {'load':>6}"
    lines = [f"peaks of {rows[0].device} on {rows[0].host}", header, "-" * len(header)]
    for peaks, load in zip(rows, loads, strict=True):
        lines.append(
            f"{peaks.dtype:<10} {format_rate(peaks.matmul_flops_per_s, 'FLOP/s'):>16} "
            f"{format_rate(peaks.copy_bytes_per_s, 'B/s'):>14} "
            f"{'?' if load is None else f'{load:.1f}':>6}"
        )
    lines.append(f"cached in {cache_dir}")
    cores = psutil.cpu_count() or 1
    if device.type == "cpu" and any(load is not None and load > cores / 2 for load in loads):
        lines.append(
            f"warning: the 1-minute load average exceeded half of the {cores} cores when "
            "measuring, so other work shared the CPU and these peaks read low; "
            "measure again with refresh on a quiet machine"
        )
    return "\n".join(lines)
