"""Device telemetry during a run: a background thread that samples the machine into telemetry.csv.

Users need to see how full the device was while a strategy ran, on the same clock as the
request timestamps. On an NVIDIA GPU the sampler reads NVML (utilisation, memory, power,
clocks, temperature and the total-energy counter); everywhere it also records the process's
CPU use, the CPU other processes used meanwhile (a shared machine's load, which slows a run
without showing in its own figures), its resident memory and the system's used memory
through psutil. Telemetry is a
witness, never a cause of failure: a reading that fails is left empty from then on, the
failure is said once in the result's note, and nothing raises into the run. A run with
nothing to sample (a simulation: its clock is virtual, and the machine running it is not the
one it predicts) takes `NoTelemetry` instead, which says why.
"""

from __future__ import annotations

import csv
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

import psutil
import pynvml
import torch

from servelab.base.errors import ConfigError
from servelab.harness.measure.flags import OTHERS_CPU

MIB = 1024 * 1024


@dataclass
class TelemetryResult:
    """What a finished sampler reports to the run summary."""

    samples: int
    energy_j: float | None  # NVML total-energy delta over the run, None without NVML
    note: str | None  # why some telemetry is missing, if any is
    source: str  # "nvml" | "psutil" | "none"


@dataclass
class _Column:
    """One telemetry.csv column and how to read its value; `failed` once a read has raised."""

    name: str
    read: Callable[[], float]
    failed: bool = False


@dataclass
class _Failure:
    """The first failure of one column: when it happened and what it said."""

    column: str
    t: float
    error: str


@dataclass
class _Sources:
    """The columns a sampler reads, with the note and shutdown that go with how they were found."""

    columns: list[_Column]
    source: str
    note: str | None
    shutdown: Callable[[], None] = field(default=lambda: None)


def nvml_device_handle(device: torch.device) -> Any:
    """The NVML handle of a CUDA device, matched by UUID so CUDA_VISIBLE_DEVICES cannot mislead.

    Falls back to the CUDA ordinal when the UUID is unknown or NVML does not recognise it.
    NVML must already be initialised.
    """
    index = device.index
    if index is None:
        index = torch.cuda.current_device() if torch.cuda.is_available() else 0
    uuid = _cuda_uuid(index)
    if uuid is not None:
        try:
            return pynvml.nvmlDeviceGetHandleByUUID(uuid)
        except pynvml.NVMLError:
            pass
    return pynvml.nvmlDeviceGetHandleByIndex(index)


def _cuda_uuid(index: int) -> str | None:
    """The device UUID in NVML's spelling ("GPU-..."), or None when torch cannot tell."""
    if not torch.cuda.is_available():
        return None
    raw = str(getattr(torch.cuda.get_device_properties(index), "uuid", "") or "")
    if not raw:
        return None
    return raw if raw.startswith(("GPU-", "MIG-")) else f"GPU-{raw}"


class OthersCpu:
    """The CPU that processes other than this one (and its children) used since the last
    read, in percent of one core: the machine's busy time less this process's, over the wall
    time between. On a VM the busy time includes what the hypervisor gave other guests
    (steal), which slows a run the same way."""

    def __init__(self, process: psutil.Process) -> None:
        self.process = process
        self.last = self._totals()

    def _totals(self) -> tuple[float, float, float]:
        times = psutil.cpu_times()
        idle = times.idle + getattr(times, "iowait", 0.0)
        guests = getattr(times, "guest", 0.0) + getattr(times, "guest_nice", 0.0)  # in user
        own = self.process.cpu_times()
        mine = own.user + own.system + own.children_user + own.children_system
        return time.monotonic(), sum(times) - idle - guests, mine

    def read(self) -> float:
        now = self._totals()
        wall, busy, own = (b - a for a, b in zip(self.last, now, strict=True))
        self.last = now
        return max(busy - own, 0.0) / wall * 100 if wall > 0 else 0.0


def _psutil_columns() -> list[_Column]:
    process = psutil.Process()
    process.cpu_percent(None)  # the first call only starts psutil's interval
    others = OthersCpu(process)
    return [
        _Column("cpu_pct", lambda: process.cpu_percent(None)),
        _Column(OTHERS_CPU, others.read),
        _Column("rss_mib", lambda: process.memory_info().rss / MIB),
        _Column("sys_mem_used_mib", lambda: psutil.virtual_memory().used / MIB),
    ]


def _nvml_columns(handle: Any) -> tuple[list[_Column], str | None]:
    """The GPU columns, and a note when the energy counter cannot be read on this GPU."""
    columns = [
        _Column("gpu_util_pct", lambda: pynvml.nvmlDeviceGetUtilizationRates(handle).gpu),
        _Column("mem_util_pct", lambda: pynvml.nvmlDeviceGetUtilizationRates(handle).memory),
        _Column("gpu_mem_used_mib", lambda: pynvml.nvmlDeviceGetMemoryInfo(handle).used / MIB),
        _Column("power_w", lambda: pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0),
        _Column(
            "sm_clock_mhz", lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)
        ),
        _Column(
            "mem_clock_mhz", lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM)
        ),
        _Column(
            "temp_c",
            lambda: pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU),
        ),
    ]
    try:
        start_mj = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    except pynvml.NVMLError as err:
        columns.append(_Column("energy_j", lambda: 0.0, failed=True))
        return columns, f"energy counter unavailable ({err}); energy_j left empty"
    columns.append(
        _Column(
            "energy_j",
            lambda: (pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) - start_mj) / 1000.0,
        )
    )
    return columns, None


def _open_sources(device: torch.device) -> _Sources:
    """NVML columns plus psutil ones on a CUDA device whose NVML works; psutil alone otherwise."""
    host = _psutil_columns()
    if device.type != "cuda":
        return _Sources(
            host,
            "psutil",
            f"GPU telemetry unavailable: the run device is {device.type}; sampled CPU via psutil",
        )
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        return _Sources(
            host,
            "psutil",
            f"GPU telemetry unavailable: NVML did not start ({err}); sampled CPU via psutil",
        )
    try:
        gpu, note = _nvml_columns(nvml_device_handle(device))
    except pynvml.NVMLError as err:
        pynvml.nvmlShutdown()
        return _Sources(
            host,
            "psutil",
            f"GPU telemetry unavailable: NVML found no handle for {device} ({err}); "
            "sampled CPU via psutil",
        )
    return _Sources(gpu + host, "nvml", note, shutdown=pynvml.nvmlShutdown)


def sample_every(period_s: float, stop: threading.Event, sample: Callable[[], bool]) -> None:
    """Call `sample` every `period_s` (a late sample moves the next one, never doubles it)
    until `stop` is set or `sample` returns False."""
    next_at = time.monotonic()
    while True:
        next_at = max(next_at + period_s, time.monotonic())
        if stop.wait(next_at - time.monotonic()) or not sample():
            return


class TelemetrySampler:
    """Background thread sampling the device every period into telemetry.csv.

    Rows are timestamped with `clock()` (the run's monotonic clock, seconds since run start):
    one when started, one every `period_s`, one when stopped. Says once (in the result's
    note) when GPU telemetry is unavailable; if NVML fails mid-run it keeps going with what
    works, records the failure in the note, and never raises into the run. Usable as a
    context manager; the result is in `.result` after it exits.
    """

    def __init__(
        self, path: Path, period_s: float, clock: Callable[[], float], device: torch.device
    ) -> None:
        if not period_s > 0:
            raise ConfigError(
                "telemetry.period_s", f"must be a positive number of seconds, got {period_s}"
            )
        self._path = path
        self._period_s = period_s
        self._clock = clock
        self._device = device
        self._stop_event = threading.Event()
        self._thread: threading.Thread | None = None
        self._file: TextIO | None = None
        self._writer: Any = None
        self._sources: _Sources | None = None
        self._samples = 0
        self._failures: list[_Failure] = []
        self._last_values: dict[str, float] = {}
        self._broken = False
        self._events: list[str] = []
        self._result: TelemetryResult | None = None

    @property
    def result(self) -> TelemetryResult | None:
        """The result once stopped, None before."""
        return self._result

    def start(self) -> None:
        """Open telemetry.csv, write its header and a first row, and start sampling."""
        if self._thread is not None:
            raise RuntimeError("TelemetrySampler.start() called twice")
        self._file = self._path.open("w", newline="", encoding="utf-8")
        self._sources = _open_sources(self._device)
        self._writer = csv.writer(self._file)
        self._writer.writerow(["t", *(column.name for column in self._sources.columns)])
        self._sample()
        self._thread = threading.Thread(target=self._run, name="telemetry", daemon=True)
        self._thread.start()

    def stop(self) -> TelemetryResult:
        """Stop sampling, write a last row, close the file and say what was measured."""
        if self._result is not None:
            return self._result
        if self._thread is None or self._sources is None or self._file is None:
            raise RuntimeError("TelemetrySampler.stop() called before start()")
        self._stop_event.set()
        self._thread.join()
        if not self._broken:
            self._guarded_sample()
        self._file.close()
        try:
            self._sources.shutdown()
        except pynvml.NVMLError as err:
            self._events.append(f"NVML shutdown failed: {err}")
        self._result = TelemetryResult(
            samples=self._samples,
            energy_j=self._energy_j(),
            note=self._note(),
            source=self._sources.source,
        )
        return self._result

    def __enter__(self) -> TelemetrySampler:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _run(self) -> None:
        sample_every(self._period_s, self._stop_event, self._guarded_sample)

    def _guarded_sample(self) -> bool:
        """Take one sample; on an unexpected error stop sampling and say why instead of raising."""
        try:
            self._sample()
        except Exception as err:  # telemetry must never take the run down
            self._broken = True
            self._events.append(f"telemetry stopped at t={self._clock():.3f}s: {err!r}")
            return False
        return True

    def _sample(self) -> None:
        assert self._sources is not None and self._file is not None
        t = self._clock()
        row = [f"{t:.6f}"]
        for column in self._sources.columns:
            row.append(self._read(column, t))
        self._writer.writerow(row)
        self._file.flush()
        self._samples += 1

    def _read(self, column: _Column, t: float) -> str:
        if column.failed:
            return ""
        try:
            value = float(column.read())
        except Exception as err:  # NVML and psutil raise many error types
            column.failed = True
            self._failures.append(_Failure(column.name, t, str(err) or type(err).__name__))
            return ""
        self._last_values[column.name] = value
        return f"{value:.3f}"

    def _energy_j(self) -> float | None:
        """The energy counter's last reading, if it never failed (a partial total would mislead)."""
        assert self._sources is not None
        energy = [c for c in self._sources.columns if c.name == "energy_j"]
        if not energy or energy[0].failed:
            return None
        return self._last_values.get("energy_j")

    def _note(self) -> str | None:
        assert self._sources is not None
        parts = [self._sources.note] if self._sources.note else []
        by_error: dict[str, list[_Failure]] = {}
        for failure in self._failures:
            by_error.setdefault(failure.error, []).append(failure)
        for error, failures in by_error.items():
            names = ", ".join(f.column for f in failures)
            parts.append(
                f"reading failed at t={failures[0].t:.3f}s ({error}); "
                f"{names} left empty from then on"
            )
        parts.extend(self._events)
        return "; ".join(parts) if parts else None


class NoTelemetry:
    """In place of a sampler for a run with nothing to sample: no telemetry.csv, and `why` as
    the result's note."""

    def __init__(self, why: str) -> None:
        self.why = why

    def start(self) -> None:
        """Nothing to start."""

    def stop(self) -> TelemetryResult:
        return TelemetryResult(samples=0, energy_j=None, note=self.why, source="none")
