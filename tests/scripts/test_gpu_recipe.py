"""The GPU recipe (`make gpu-wheels`, unpacked by `scripts/gpu_recipe.sh`): what a bare GPU
machine with no package index needs beyond its own packages travels with the tree, and is
loaded only where it can work."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from servelab.base.errors import ConfigError
from servelab.harness.run.compose import compose
from servelab.harness.run.run import run
from servelab.harness.run.settings import model_of
from servelab.models import load
from servelab.models.spec import model_spec

ROOT = Path(__file__).resolve().parents[2]
THIS_PYTHON = f"{sys.version_info[0]}.{sys.version_info[1]}"


def source_recipe(recipe: Path, out: Path, then: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(out), "RECIPE": str(recipe)}
    return subprocess.run(
        ["bash", "-c", f"set -u; source scripts/gpu_recipe.sh; {then}"],
        cwd=ROOT, env=env, capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize("version", [THIS_PYTHON, "2.7"], ids=["this-python", "another"])
def test_the_recipes_wheels_load_for_their_python_only(tmp_path: Path, version: str) -> None:
    recipe = tmp_path / "recipe"
    recipe.mkdir()
    (recipe / "python-version").write_text(version + "\n")
    with zipfile.ZipFile(recipe / "recipe_probe-1.0-py3-none-any.whl", "w") as wheel:
        wheel.writestr("recipe_probe.py", "FROM = 'the recipe'\n")
    done = source_recipe(recipe, tmp_path / "out", '"$PYTHON" -c "import recipe_probe"')
    if version == THIS_PYTHON:
        assert done.returncode == 0, done.stderr
        assert f"loaded for Python {THIS_PYTHON}" in done.stdout
    else:
        assert done.returncode != 0 and "No module named 'recipe_probe'" in done.stderr
        assert f"are for Python 2.7, this is {THIS_PYTHON}: not loaded" in done.stdout


@pytest.mark.integration
def test_a_dummy_run_reads_the_recipes_tokenizer_and_downloads_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    borrowed = load.dummy_tokenizer_path(model_of(compose(["model=dummy-tiny"])))
    recipe = tmp_path / "recipe"
    recipe.mkdir()
    shutil.copytree(borrowed, recipe / "tokenizer")
    done = source_recipe(recipe, tmp_path / "out", 'echo "${TOKENIZER[@]}"')
    override = done.stdout.split()[-1]
    assert override == f"model.tokenizer={recipe / 'tokenizer'}"

    def no_index(*_: object) -> Path:
        raise AssertionError("a dummy run with its tokenizer given downloaded a model")

    monkeypatch.setattr(load, "fetch_wheel_model", no_index)
    cfg = compose([
        "model=dummy-tiny", override, f"engine.cache_dir={tmp_path / 'empty-cache'}",
        "engine.dtype=fp32", "telemetry.roofline=false", "workload.num_requests=2",
    ])  # fmt: skip
    summary = run(cfg, tmp_path / "run", progress=False)
    assert summary["status"] == "complete" and summary["completed"] == 2


def test_a_given_tokenizer_folder_without_one_is_refused_at_once(tmp_path: Path) -> None:
    cfg = compose(["model=dummy-tiny", f"model.tokenizer={tmp_path}"])
    with pytest.raises(ConfigError, match=r"^model\.tokenizer: .* holds no tokenizer\.json"):
        model_spec(cfg.model, tmp_path)
