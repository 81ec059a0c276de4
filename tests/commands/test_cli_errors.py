"""Bad input stops before any work with one line naming the field, and exit status 2."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from servelab.commands.cli import main
from servelab.models.embedded import EMBEDDED_MODELS


def _fail(monkeypatch, capsys, tmp_path: Path, *args: str) -> str:
    argv = ["servelab", *args, f"hydra.run.dir={tmp_path / 'run'}", "telemetry.roofline=false"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("servelab: error: ")
    assert not (tmp_path / "run" / "requests.jsonl").exists()
    return lines[0]


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (("model=nosuch",), "model: unknown preset 'nosuch'"),
        (("strategy=nosuch",), "strategy: unknown preset 'nosuch'"),
        (("workload=nosuch",), "workload: unknown preset 'nosuch'"),
        (("model.name=nosuch",), "model.name: unknown embedded model"),
        (
            ("model=gguf", "model.path=/no/such/file.gguf"),
            "model.path: /no/such/file.gguf does not",
        ),
        (("model=dummy-tiny", "engine.kv_budget=1KiB"), "engine.kv_budget:"),
        (("model=dummy-tiny", "engine.kv_budget=lots"), "engine.kv_budget: 'lots' is not a size"),
        (("model=dummy-tiny", "engine.max_batch_size=0"), "engine.max_batch_size:"),
        (("model=dummy-tiny", "engine.dtype=fp8"), "engine.dtype:"),
        (("model=dummy-tiny", "strategy.batching=greedy"), "strategy.batching:"),
        (("model=dummy-tiny", "workload.output_len.value=0"), "workload.output_len"),
        (("model=dummy-tiny", "strategy=vllm-spec-ngram", "strategy.gamma=0"), "strategy.gamma:"),
        (
            ("model=dummy-tiny", "strategy=vllm-spec-draft", "strategy.draft_model=nosuch"),
            "strategy.draft_model: unknown model preset 'nosuch'",
        ),
        (
            ("model=dummy-tiny", "workload.input_len.lo=600", "workload.input_len.hi=700"),
            "workload",
        ),
    ],
)
@pytest.mark.integration
def test_bad_input_is_one_clear_line(monkeypatch, capsys, tmp_path, args, field) -> None:
    assert field in _fail(monkeypatch, capsys, tmp_path, *args)


@pytest.mark.integration
def test_kv_budget_smaller_than_one_request_says_what_it_needs(monkeypatch, capsys, tmp_path):
    line = _fail(monkeypatch, capsys, tmp_path, "model=dummy-tiny", "engine.kv_budget=8KiB")
    assert "engine.kv_budget: no request can be served: request 0 needs" in line
    assert "raise engine.kv_budget" in line


def test_corrupt_model_file_is_caught_by_its_sha256(monkeypatch, capsys, tmp_path) -> None:
    model = EMBEDDED_MODELS["smollm2-135m"]
    corrupt = tmp_path / "cache" / "models" / model.member
    corrupt.parent.mkdir(parents=True)
    corrupt.write_bytes(b"GGUF but not really")
    line = _fail(monkeypatch, capsys, tmp_path, f"engine.cache_dir={tmp_path / 'cache'}")
    assert "model.path:" in line and "sha256" in line and "delete it" in line
