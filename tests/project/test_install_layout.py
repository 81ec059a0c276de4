"""The install's one import namespace: the wheel's top level is `servelab` alone, and nothing in
the checkout shadows an installed distribution or is shadowed by one when Python runs from the
repository root (as `python -m pytest` and `python -m servelab` do)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from scripts.import_graph import PACKAGES

ROOT = Path(__file__).resolve().parents[2]
LAYERS = PACKAGES  # the code's folders, each of which setup.py must install
NOT_INSTALLED = ROOT / "reports" / "published"
SOURCES = ("pyproject.toml", "setup.py", "README.md", "src", *LAYERS, "conf")


def project_modules() -> list[str]:
    """Every module of the project under its installed name, from the layer folders' files."""
    names = []
    for layer in LAYERS:
        for path in sorted((ROOT / layer).rglob("*.py")):
            if NOT_INSTALLED in path.parents:
                continue
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            names.append(".".join(("servelab", *parts)))
    return names


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    """Built from a copy of the sources: setuptools builds in the source tree it is given."""
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheel")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(
                ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__")
            )
        else:
            shutil.copy2(ROOT / name, source / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]
        + ["--no-index", "-w", str(out), str(source)],
        check=True,
        capture_output=True,
    )
    (built,) = out.glob("servelab-*.whl")
    return zipfile.ZipFile(built)


def test_the_wheel_installs_one_top_level_name(wheel: zipfile.ZipFile) -> None:
    top_level = {name.split("/")[0] for name in wheel.namelist()}
    version = importlib.metadata.version("servelab")
    assert top_level == {"servelab", f"servelab-{version}.dist-info"}
    assert wheel.read(f"servelab-{version}.dist-info/top_level.txt").decode().split() == [
        "servelab"
    ]


def test_the_wheel_holds_every_module_and_the_data_they_read(wheel: zipfile.ZipFile) -> None:
    files = set(wheel.namelist())
    modules = {name.replace(".", "/") for name in project_modules()}
    missing = [m for m in modules if f"{m}.py" not in files and f"{m}/__init__.py" not in files]
    assert missing == []
    for data in [*(ROOT / "conf").rglob("*.yaml"), *(ROOT / "kernels" / "cpu").glob("*.[ch]*")]:
        assert f"servelab/{data.relative_to(ROOT).as_posix()}" in files
    assert not any(name.startswith("servelab/reports/published") for name in files)


def test_an_installed_distribution_wins_over_a_checkout_folder_of_its_name() -> None:
    """Run from the root, each folder there is importable by its own name: where an installed
    distribution provides that name too, the import must give the installed one."""
    folders = [p.name for p in ROOT.iterdir() if p.is_dir() and any(p.glob("*.py"))]
    assert [name for name in folders if (ROOT / name / "__init__.py").exists()] == []
    provided = importlib.metadata.packages_distributions()
    shared = [name for name in folders if name in provided]
    program = "\n".join(
        [
            "import importlib",
            f"for name in {shared!r}:",
            "    print(importlib.import_module(name).__file__)",
        ]
    )
    result = subprocess.run(
        [sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, check=True
    )
    imported = dict(zip(shared, result.stdout.split(), strict=True))
    assert {name: f for name, f in imported.items() if Path(f).parent == ROOT / name} == {}


def test_every_module_then_transformers_integrations_import_from_the_root() -> None:
    """Hugging Face's `kernels` (which transformers imports when it is installed) and every
    module of the project, in one process started at the repository root."""
    if importlib.util.find_spec("kernels") is None:
        pytest.skip("Hugging Face's kernels is not installed: nothing here to collide with")
    program = "\n".join(
        [
            "import importlib, sys",
            f"for name in {project_modules()!r}:",
            "    importlib.import_module(name)",
            "import transformers.integrations.hub_kernels",
            "import kernels",
            "print(kernels.__file__)",
            "from transformers.utils.import_utils import is_kernels_available",
            "print(is_kernels_available())",
        ]
    )
    result = subprocess.run(
        [sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    kernels_file, available = result.stdout.split()
    assert Path(kernels_file).parent != ROOT / "kernels"
    assert available == "True"
