"""Microbenchmark settings: torch on one thread, recorded with every saved run.

On a shared machine two intra-op threads stall each other whenever another process takes a
core, which makes tensor timings swing tenfold; one thread times the code itself, which is
what a comparison between two commits needs. The thread count and torch version are saved in
each run's machine info, so runs taken differently are not compared unknowingly.
"""

from __future__ import annotations

import pytest
import torch

THREADS = 1


def pytest_configure(config: pytest.Config) -> None:
    del config
    torch.set_num_threads(THREADS)


def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict) -> None:
    del config
    machine_info["torch"] = torch.__version__
    machine_info["torch_threads"] = torch.get_num_threads()
