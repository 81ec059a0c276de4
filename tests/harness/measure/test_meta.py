"""The reproducibility record: every field present, JSON-safe, and robust to missing git or NVML."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pynvml
import pytest
import torch

from servelab.harness.measure import meta
from servelab.harness.measure.meta import CPU_FLAGS_OF_INTEREST, collect_meta, git_state, nvml_info

CONFIG = {"strategy": {"batching": "static", "kv": "contiguous"}, "seed": 0}


def collect(device: torch.device) -> dict:
    return collect_meta(
        CONFIG, Path("/models/m.gguf"), "ab" * 32, "wl-123", {"workload": 7, "sampling": 0}, device
    )


def test_meta_has_every_field_and_survives_json() -> None:
    record = collect(torch.device("cpu"))
    assert json.loads(json.dumps(record)) == record
    assert set(record) == {
        "schema",
        "started_at",
        "host",
        "versions",
        "device",
        "env",
        "model",
        "workload_hash",
        "seeds",
        "config",
    }
    assert set(record["versions"]) == {
        "python",
        "torch",
        "triton",
        "transformers",
        "numpy",
        "hydra-core",
        "gguf",
        "servelab",
        "git_commit",
        "git_dirty",
        "lock",
    }
    assert record["versions"]["torch"] == torch.__version__
    assert record["model"] == {"file": "/models/m.gguf", "sha256": "ab" * 32}
    assert record["workload_hash"] == "wl-123"
    assert record["seeds"] == {"workload": 7, "sampling": 0}
    assert record["config"] == CONFIG
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+[+-]\d\d:\d\d", record["started_at"])
    cpu = record["device"]["cpu"]
    assert record["device"]["type"] == "cpu"
    assert record["device"]["gpu"] is None
    assert cpu["logical_cores"] >= 1
    assert cpu["torch_threads"] == torch.get_num_threads()
    assert cpu["flags"] == [f for f in CPU_FLAGS_OF_INTEREST if f in cpu["flags"]]
    assert isinstance(cpu["model"], str) and cpu["model"]


def test_git_state_matches_the_checkout() -> None:
    commit, dirty = git_state()
    head = subprocess.run(
        ["git", "-C", str(meta.REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    if head.returncode != 0:
        assert (commit, dirty) == (None, None)
    else:
        assert commit == head.stdout.strip()
        assert re.fullmatch(r"[0-9a-f]{40}", commit)
        assert isinstance(dirty, bool)


def test_no_git_checkout_or_no_git_gives_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(meta, "REPO_ROOT", tmp_path)
    assert git_state() == (None, None)

    def no_git(*args: object, **kwargs: object) -> None:
        raise FileNotFoundError("git")

    monkeypatch.setattr(subprocess, "run", no_git)
    versions = collect(torch.device("cpu"))["versions"]
    assert (versions["git_commit"], versions["git_dirty"]) == (None, None)


def test_nvml_info_reads_driver_clocks_and_power(monkeypatch: pytest.MonkeyPatch) -> None:
    fakes = {
        "nvmlInit": lambda: None,
        "nvmlShutdown": lambda: None,
        "nvmlDeviceGetHandleByIndex": lambda index: f"gpu{index}",
        "nvmlDeviceGetName": lambda h: "NVIDIA H200",
        "nvmlSystemGetDriverVersion": lambda: b"570.86.15",
        "nvmlSystemGetCudaDriverVersion": lambda: 12080,
        "nvmlDeviceGetClockInfo": lambda h, kind: 1980 if kind == pynvml.NVML_CLOCK_SM else 3201,
        "nvmlDeviceGetMaxClockInfo": lambda h, kind: 1980 if kind == pynvml.NVML_CLOCK_SM else 3201,
        "nvmlDeviceGetEnforcedPowerLimit": lambda h: 700_000,
    }
    for name, fake in fakes.items():
        monkeypatch.setattr(pynvml, name, fake)
    assert nvml_info(torch.device("cuda", 0)) == {
        "name": "NVIDIA H200",
        "driver": "570.86.15",
        "cuda_driver": "12.8",
        "sm_clock_mhz": 1980,
        "mem_clock_mhz": 3201,
        "sm_clock_max_mhz": 1980,
        "mem_clock_max_mhz": 3201,
        "power_limit_w": 700.0,
    }

    def not_supported(h: object) -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetEnforcedPowerLimit", not_supported)
    assert nvml_info(torch.device("cuda", 0))["power_limit_w"] is None


def test_nvml_missing_is_recorded_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_driver() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_driver)
    assert nvml_info(torch.device("cuda")) == {
        "error": "NVML did not start: NVML Shared Library Not Found"
    }
    record = collect(torch.device("cuda"))
    assert json.loads(json.dumps(record)) == record
    gpu = record["device"]["gpu"]
    if torch.cuda.is_available():
        assert gpu["nvml"] == {"error": "NVML did not start: NVML Shared Library Not Found"}
    else:
        assert gpu is None
