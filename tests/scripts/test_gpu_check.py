"""`scripts/gpu_check.sh --cpu`: the GPU check's steps on the CPU, so the script that will run
on the GPU machine as it comes is exercised here and does not rot; and its summary, which
says what failed."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from scripts.gpu_check_summary import steps_table
from servelab.harness.run.compose import compose
from servelab.harness.run.settings import model_of
from servelab.models.load import dummy_tokenizer_path

ROOT = Path(__file__).resolve().parents[2]
STEPS = [
    "machine", "run-vllm-40", "run-vllm-awq-40", "run-orca-40", "run-fastertransformer-40",
    "run-vllm-memory", "profile-vllm", "kernel-tests", "bench-attention", "bench-int4",
    "calibrate-fp32", "step-profile", "serve-openai", "search",
]  # fmt: skip


def test_the_check_runs_every_step_on_the_cpu_and_summarises_them(tmp_path: Path) -> None:
    """With a recipe that brings the tokenizer (as `make gpu-wheels` writes it) and the package
    index unreachable: the check's own cache starts empty, and nothing is downloaded."""
    recipe = tmp_path / "recipe"
    cfg = compose(["model=dummy-tiny"])
    shutil.copytree(dummy_tokenizer_path(model_of(cfg)), recipe / "tokenizer")
    out = tmp_path / "check"
    env = {
        "PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "HOME": str(Path.home()),
        "RECIPE": str(recipe), "PIP_INDEX_URL": "http://127.0.0.1:9/", "PIP_NO_INDEX": "1",
    }  # fmt: skip
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--cpu", str(out)],
        env=env, capture_output=True, text=True, check=False, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [line.split("\t") for line in (out / "steps.tsv").read_text().splitlines()]
    assert [row[0] for row in rows] == STEPS and all(row[1] == "0" for row in rows)
    summary = (out / "summary.md").read_text()
    assert summary.splitlines()[:3] == ["# GPU check", "", "every step passed"]
    for strategy in ("vllm", "vllm-awq", "orca", "fastertransformer"):
        assert f"| {strategy}-40 | complete | 8/0 |" in summary
    assert "| serve-openai | complete | 16/0 |" in summary
    assert "| vllm-memory | complete | 16/0 |" in summary  # KV memory bounds its batch
    by_batch = summary.split("## Decode steps against their floor, by batch")[1].split("##")[0]
    assert "| vllm-40 | " in by_batch and "| profile-vllm | " in by_batch
    assert "| run | batch 1 | batch 32 | largest batch |" in by_batch
    assert "| off: no CUDA (cpu) |" in summary  # each run says whether it replayed graphs
    assert "median decode step: 0 kernels" in summary  # a CPU launches none; it counts operators
    assert (out / "kernel-tests.xml").exists() and " 0 failures, 0 errors" in summary
    assert not (out / "cache" / "models").exists()  # the tokenizer came with the recipe
    profiled = summary.split("## Step profile")[1].split("##")[0]
    assert "timed on " in profiled and "no `servelab plan` preset is this device" in profiled
    job = summary.split("## The main job")[1]
    assert "device: cpu (" in job and "sustained request rate" in job  # make run's answer
    assert '"budget_s": 10' in (out / "search" / "search.json").read_text()


def test_a_failed_or_timed_out_step_is_said(tmp_path: Path) -> None:
    (tmp_path / "steps.tsv").write_text(
        "machine\t0\t1\nkernel-tests\t1\t30\nrun-vllm-4\t124\t120\n"
    )
    lines, failed = steps_table(tmp_path)
    assert failed
    assert lines[2:] == [
        "| machine | passed | 1 |",
        "| kernel-tests | FAILED (exit 1) | 30 |",
        "| run-vllm-4 | TIMED OUT | 120 |",
    ]
