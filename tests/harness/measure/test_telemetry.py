"""The telemetry sampler (psutil for real, NVML through a stand-in)."""

from __future__ import annotations

import csv
import itertools
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pynvml
import pytest
import torch

from servelab.base.errors import ConfigError
from servelab.harness.measure import telemetry
from servelab.harness.measure.telemetry import TelemetrySampler

HOST_COLUMNS = ["cpu_pct", "others_cpu_pct", "rss_mib", "sys_mem_used_mib"]
GPU_COLUMNS = [
    "gpu_util_pct",
    "mem_util_pct",
    "gpu_mem_used_mib",
    "power_w",
    "sm_clock_mhz",
    "mem_clock_mhz",
    "temp_c",
    "energy_j",
]


def read_rows(path: Path) -> tuple[list[str], list[list[str]]]:
    with path.open(newline="") as f:
        header, *rows = list(csv.reader(f))
    return header, rows


def wait_for_rows(path: Path, count: int) -> None:
    """Wait (at most 10 s) until the sampler thread has written `count` data rows."""
    deadline = time.monotonic() + 10.0
    while len(read_rows(path)[1]) < count:
        assert time.monotonic() < deadline, f"sampler wrote fewer than {count} rows in 10 s"
        time.sleep(0.005)


def counting_clock() -> Callable[[], float]:
    """A clock that reads 0, 1, 2, ... so every row's timestamp is known in advance."""
    ticks = itertools.count()
    return lambda: float(next(ticks))


class FakeGpu:
    """Stands in for the pynvml calls the sampler makes.

    The GPU is lost (every call fails) once the energy counter, the last GPU column of a row,
    has been read `lost_after_energy_reads` times, so the failure starts at a known row.
    """

    def __init__(
        self, energy_supported: bool = True, lost_after_energy_reads: int | None = None
    ) -> None:
        self.lost = False
        self.energy_supported = energy_supported
        self.lost_after_energy_reads = lost_after_energy_reads
        self.energy_reads = 0
        self.energy_mj = 1_000_000
        self.handle_indices: list[int] = []
        self.shutdowns = 0

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        patches = {
            "nvmlInit": lambda: None,
            "nvmlShutdown": self.shutdown,
            "nvmlDeviceGetHandleByIndex": self.handle,
            "nvmlDeviceGetUtilizationRates": lambda h: self.read(
                SimpleNamespace(gpu=87, memory=40)
            ),
            "nvmlDeviceGetMemoryInfo": lambda h: self.read(SimpleNamespace(used=3 * 1024**3)),
            "nvmlDeviceGetPowerUsage": lambda h: self.read(250_500),
            "nvmlDeviceGetClockInfo": lambda h, kind: self.read(
                1980 if kind == pynvml.NVML_CLOCK_SM else 2619
            ),
            "nvmlDeviceGetTemperature": lambda h, kind: self.read(61),
            "nvmlDeviceGetTotalEnergyConsumption": self.energy,
        }
        for name, fake in patches.items():
            monkeypatch.setattr(pynvml, name, fake)

    def shutdown(self) -> None:
        self.shutdowns += 1

    def handle(self, index: int) -> str:
        self.handle_indices.append(index)
        return f"gpu{index}"

    def read(self, value: object) -> object:
        if self.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return value

    def energy(self, handle: str) -> int:
        if not self.energy_supported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        self.read(None)
        value = self.energy_mj
        self.energy_mj += 1500  # 1.5 J between readings
        self.energy_reads += 1
        if self.energy_reads == self.lost_after_energy_reads:
            self.lost = True
        return value


def test_psutil_path_writes_rows_on_the_given_clock(tmp_path: Path) -> None:
    origin = time.monotonic()
    path = tmp_path / "telemetry.csv"
    with TelemetrySampler(
        path, 0.01, lambda: 100.0 + time.monotonic() - origin, torch.device("cpu")
    ) as sampler:
        wait_for_rows(path, 4)
        torch.randn(256, 256) @ torch.randn(256, 256)
    result = sampler.result
    header, rows = read_rows(path)
    assert header == ["t", *HOST_COLUMNS]
    assert result is not None
    assert result.samples == len(rows) >= 5
    assert result.source == "psutil"
    assert result.energy_j is None
    assert result.note == (
        "GPU telemetry unavailable: the run device is cpu; sampled CPU via psutil"
    )
    times = [float(row[0]) for row in rows]
    assert times[0] >= 100.0
    assert all(b > a for a, b in itertools.pairwise(times))
    for row in rows:
        cpu_pct, others_pct, rss_mib, sys_used_mib = (float(cell) for cell in row[1:])
        assert cpu_pct >= 0.0 and others_pct >= 0.0
        assert rss_mib > 10.0
        assert sys_used_mib > rss_mib


def test_nvml_samples_are_parsed_and_energy_is_the_counter_delta(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gpu = FakeGpu()
    gpu.install(monkeypatch)
    # the fake GPU's ordinal is asked of NVML alone: no CUDA runtime (a host may have one GPU)
    monkeypatch.setattr(telemetry, "_cuda_uuid", lambda index: None)
    path = tmp_path / "telemetry.csv"
    sampler = TelemetrySampler(path, 3600.0, counting_clock(), torch.device("cuda", 1))
    sampler.start()
    result = sampler.stop()
    header, rows = read_rows(path)
    assert header == ["t", *GPU_COLUMNS, *HOST_COLUMNS]
    gpu_cells = [row[: 1 + len(GPU_COLUMNS)] for row in rows]
    assert gpu_cells == [
        ["0.000000", "87.000", "40.000", "3072.000", "250.500", "1980.000", "2619.000",
         "61.000", "1.500"],
        ["1.000000", "87.000", "40.000", "3072.000", "250.500", "1980.000", "2619.000",
         "61.000", "3.000"],
    ]  # fmt: skip
    assert all(cell != "" for row in rows for cell in row)
    assert result == telemetry.TelemetryResult(samples=2, energy_j=3.0, note=None, source="nvml")
    assert gpu.handle_indices == [1]
    assert gpu.shutdowns == 1


def test_nvml_failing_mid_run_keeps_sampling_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    FakeGpu(lost_after_energy_reads=3).install(monkeypatch)  # start, row 0, row 1
    path = tmp_path / "telemetry.csv"
    sampler = TelemetrySampler(path, 0.01, counting_clock(), torch.device("cuda"))
    sampler.start()
    wait_for_rows(path, 5)
    result = sampler.stop()
    header, rows = read_rows(path)
    for row in rows[:2]:
        assert all(cell != "" for cell in row)
    for row in rows[2:]:
        assert row[1 : 1 + len(GPU_COLUMNS)] == [""] * len(GPU_COLUMNS)
        assert all(cell != "" for cell in row[1 + len(GPU_COLUMNS) :])
    assert [float(row[0]) for row in rows] == [float(i) for i in range(len(rows))]
    assert result.samples == len(rows) >= 6
    assert result.source == "nvml"
    assert result.energy_j is None
    assert result.note == (
        f"reading failed at t=2.000s (GPU is lost); "
        f"{', '.join(GPU_COLUMNS)} left empty from then on"
    )


def test_missing_energy_counter_leaves_its_column_empty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    FakeGpu(energy_supported=False).install(monkeypatch)
    path = tmp_path / "telemetry.csv"
    sampler = TelemetrySampler(path, 3600.0, counting_clock(), torch.device("cuda"))
    sampler.start()
    result = sampler.stop()
    header, rows = read_rows(path)
    energy = header.index("energy_j")
    assert [row[energy] for row in rows] == ["", ""]
    assert [row[energy - 1] for row in rows] == ["61.000", "61.000"]
    assert result.energy_j is None
    assert result.note == "energy counter unavailable (Not Supported); energy_j left empty"


def test_nvml_that_will_not_start_falls_back_to_psutil(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_driver() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_driver)
    path = tmp_path / "telemetry.csv"
    with TelemetrySampler(path, 3600.0, counting_clock(), torch.device("cuda")) as sampler:
        pass
    assert read_rows(path)[0] == ["t", *HOST_COLUMNS]
    assert sampler.result == telemetry.TelemetryResult(
        samples=2,
        energy_j=None,
        note="GPU telemetry unavailable: NVML did not start (NVML Shared Library Not Found); "
        "sampled CPU via psutil",
        source="psutil",
    )


def test_sampler_rejects_a_non_positive_period(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^telemetry\.period_s: must be a positive"):
        TelemetrySampler(tmp_path / "t.csv", 0.0, time.monotonic, torch.device("cpu"))


def test_another_process_spinning_counts_as_others_cpu_and_this_ones_does_not() -> None:
    """A child spinning for a second is another process until it is waited for: its core
    shows in `others_cpu_pct`; this process spinning as long does not."""
    import subprocess
    import sys

    import psutil

    others = telemetry.OthersCpu(psutil.Process())
    spin = "import time\nend = time.monotonic() + 1.0\nwhile time.monotonic() < end: pass"
    child = subprocess.Popen([sys.executable, "-c", spin])
    time.sleep(0.9)
    while_child = others.read()
    child.wait()
    others.read()
    end = time.monotonic() + 0.9
    while time.monotonic() < end:  # this process busy, no child running
        pass
    while_self = others.read()
    assert while_child > 30.0  # a core, less what a loaded machine gives it
    assert while_self < while_child
