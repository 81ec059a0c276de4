"""Peak measurement: the cache round trip, the timing loop, and the calibrate table."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import psutil
import pytest
import torch

from servelab.base.errors import ConfigError
from servelab.harness.measure import calibrate
from servelab.harness.measure.calibrate import (
    Budget,
    Peaks,
    best_seconds,
    calibrate_main,
    device_name,
    format_rate,
    measure_peaks,
)

CPU = torch.device("cpu")


class CountingMeasures:
    """Replaces the two measurements with fixed figures and counts how often they run."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[str, torch.dtype]] = []
        monkeypatch.setattr(calibrate, "measure_matmul_flops", self.matmul)
        monkeypatch.setattr(calibrate, "measure_copy_bytes", self.copy)

    def matmul(self, device: torch.device, dtype: torch.dtype, budget: Budget) -> float:
        self.calls.append(("matmul", dtype))
        return 1.5e11 if dtype == torch.bfloat16 else 5.37e10

    def copy(self, device: torch.device, dtype: torch.dtype, budget: Budget) -> float:
        self.calls.append(("copy", dtype))
        return 2.25e10


def test_peaks_are_cached_per_dtype_and_refreshed_on_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    measures = CountingMeasures(monkeypatch)
    first = measure_peaks(CPU, torch.float32, tmp_path)
    expected = Peaks(
        matmul_flops_per_s=5.37e10,
        copy_bytes_per_s=2.25e10,
        device=device_name(CPU),
        dtype="float32",
        host=socket.gethostname(),
    )
    assert first == expected
    assert measures.calls == [("matmul", torch.float32), ("copy", torch.float32)]

    assert measure_peaks(CPU, torch.float32, tmp_path) == expected
    assert len(measures.calls) == 2  # read back from the json, not measured again

    files = list(tmp_path.glob("peaks-*-float32.json"))
    assert len(files) == 1
    assert json.loads(files[0].read_text())["peaks"] == {
        "matmul_flops_per_s": 5.37e10,
        "copy_bytes_per_s": 2.25e10,
        "device": expected.device,
        "dtype": "float32",
        "host": expected.host,
    }

    assert measure_peaks(CPU, torch.bfloat16, tmp_path).matmul_flops_per_s == 1.5e11
    assert len(measures.calls) == 4  # another dtype is another measurement
    assert measure_peaks(CPU, torch.float32, tmp_path, refresh=True) == expected
    assert len(measures.calls) == 6


def test_a_damaged_cache_file_is_measured_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    measures = CountingMeasures(monkeypatch)
    measure_peaks(CPU, torch.float32, tmp_path)
    (cache,) = tmp_path.glob("peaks-*.json")
    cache.write_text('{"peaks": {"matmul_flops_per_s": 1.0}}')
    assert measure_peaks(CPU, torch.float32, tmp_path).matmul_flops_per_s == 5.37e10
    assert len(measures.calls) == 4


def test_a_refresh_raises_a_cached_peak_but_never_lowers_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (before: a refresh under load overwrote an 870 GFLOP/s peak with 427)
    measured = {"matmul": 8.7e11, "copy": 3.6e10}
    monkeypatch.setattr(calibrate, "measure_matmul_flops", lambda d, t, b: measured["matmul"])
    monkeypatch.setattr(calibrate, "measure_copy_bytes", lambda d, t, b: measured["copy"])
    monkeypatch.setattr(psutil, "getloadavg", lambda: (0.1, 0.0, 0.0))
    first = measure_peaks(CPU, torch.bfloat16, tmp_path)
    when_matmul = calibrate.provenance(tmp_path, first)["matmul_flops_per_s"]["measured_at"]
    measured.update(matmul=4.27e11, copy=7.0e10)  # a busy machine: matmul low, copy higher
    monkeypatch.setattr(psutil, "getloadavg", lambda: (1.8, 0.0, 0.0))
    second = measure_peaks(CPU, torch.bfloat16, tmp_path, refresh=True)
    assert (second.matmul_flops_per_s, second.copy_bytes_per_s) == (8.7e11, 7.0e10)
    kept = calibrate.provenance(tmp_path, second)
    assert kept["matmul_flops_per_s"] == {"measured_at": when_matmul, "load_average_1m": 0.1}
    assert kept["copy_bytes_per_s"]["load_average_1m"] == 1.8
    assert measure_peaks(CPU, torch.bfloat16, tmp_path) == second


def test_a_run_that_beats_a_peak_asks_for_a_new_measurement(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    measures = CountingMeasures(monkeypatch)
    peaks = measure_peaks(CPU, torch.float32, tmp_path)
    beaten = calibrate.remeasure_if_beaten
    assert beaten(CPU, torch.float32, tmp_path, peaks, 5.0e10, 2.0e10) is None
    assert len(measures.calls) == 2
    assert beaten(CPU, torch.float32, tmp_path, peaks, 6.0e10, 2.0e10) == peaks
    assert len(measures.calls) == 4  # measured again; the same figures, so the same peaks


def test_best_seconds_warms_up_then_keeps_the_fastest_of_its_repeats() -> None:
    calls: list[int] = []
    budget = Budget(matmul_n=1, copy_bytes=1, min_repeats=3, max_repeats=4, seconds=0.0)
    assert best_seconds(lambda: calls.append(1), CPU, budget) > 0.0
    assert len(calls) == 1 + 3
    long = Budget(matmul_n=1, copy_bytes=1, min_repeats=1, max_repeats=4, seconds=3600.0)
    best_seconds(lambda: calls.append(1), CPU, long)
    assert len(calls) == 4 + 1 + 4


def test_real_measurements_on_small_operands_give_positive_rates() -> None:
    tiny = Budget(matmul_n=64, copy_bytes=1 << 20, min_repeats=2, max_repeats=2, seconds=0.0)
    assert calibrate.measure_matmul_flops(CPU, torch.float32, tiny) > 0.0
    assert calibrate.measure_copy_bytes(CPU, torch.bfloat16, tiny) > 0.0


def test_calibrate_main_prints_one_row_per_dtype_with_the_load_it_was_measured_under(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    CountingMeasures(monkeypatch)
    monkeypatch.setattr(psutil, "cpu_count", lambda logical=True: 2)
    monkeypatch.setattr(psutil, "getloadavg", lambda: (0.3, 0.0, 0.0))
    calibrate_main(CPU, [torch.float32], tmp_path, refresh=False)
    monkeypatch.setattr(psutil, "getloadavg", lambda: (5.6, 0.0, 0.0))
    table = calibrate_main(CPU, [torch.float32, torch.bfloat16], tmp_path, refresh=False)
    assert table.splitlines() == [
        f"peaks of {device_name(CPU)} on {socket.gethostname()}",
        "dtype                matmul           copy   load",
        "-------------------------------------------------",
        "float32        53.7 GFLOP/s      22.5 GB/s    0.3",
        "bfloat16        150 GFLOP/s      22.5 GB/s    5.6",
        f"cached in {tmp_path}",
        "warning: the 1-minute load average exceeded half of the 2 cores when measuring, "
        "so other work shared the CPU and these peaks read low; "
        "measure again with refresh on a quiet machine",
    ]
    quiet = calibrate_main(CPU, [torch.float32], tmp_path, refresh=False)
    assert quiet.splitlines()[-1] == f"cached in {tmp_path}"


def test_bad_calibration_requests_are_refused_before_measuring(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^calibrate\.dtype: torch\.int8 is not measured"):
        measure_peaks(CPU, torch.int8, tmp_path)
    with pytest.raises(ConfigError, match=r"^calibrate\.dtypes: name at least one dtype"):
        calibrate_main(CPU, [], tmp_path, refresh=False)
    with pytest.raises(ConfigError, match=r"^device: cannot calibrate meta"):
        measure_peaks(torch.device("meta"), torch.float32, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_format_rate_picks_a_prefix() -> None:
    assert format_rate(5.37e10, "FLOP/s") == "53.7 GFLOP/s"
    assert format_rate(4.35e12, "B/s") == "4.35 TB/s"
    assert format_rate(8.12e14, "FLOP/s") == "812 TFLOP/s"
    assert format_rate(12.0, "B/s") == "12 B/s"


@pytest.mark.parametrize(("probe_s", "side"), [(1e-6, 2048), (0.02, 704), (10.0, 256)])
def test_a_slow_product_is_measured_smaller(monkeypatch, probe_s: float, side: int) -> None:
    # a 256-side product in probe_s: the measured side keeps one product under MAX_PRODUCT_S
    monkeypatch.setattr(calibrate, "_time_cpu", lambda fn: probe_s)
    assert calibrate.matmul_side(torch.device("cpu"), torch.float32, calibrate.CPU_BUDGET) == side
