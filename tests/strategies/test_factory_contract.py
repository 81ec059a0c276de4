"""The strategy axes hold to their factory contracts (`strategies/factories.py`), checked by mypy.

Every option's `build`, every registry and every call that builds a strategy's parts is typed
by its axis's contract; a factory that takes other arguments, or a call site that passes
other ones, is a type error. The second test shows the check fails on such a mismatch.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.import_graph import PACKAGES

ROOT = Path(__file__).resolve().parents[2]
CHECKED = [
    "-p",
    "servelab.strategies",
    "-p",
    "servelab.engine",
    "-p",
    "servelab.harness.run.simulate",
    "-m",
    "servelab.harness.run.build",
]


@pytest.fixture(scope="module")
def namespace_view(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The installed layout (`servelab/<folder>`) as links to the checkout's folders: mypy reads
    modules from files and cannot follow the editable install's import hook."""
    view = tmp_path_factory.mktemp("view")
    (view / "servelab").mkdir()
    for layer in PACKAGES:
        (view / "servelab" / layer).symlink_to(ROOT / layer, target_is_directory=True)
    return view


def _mypy(view: Path, *targets: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "mypy", "--no-incremental", "--no-error-summary"]
    command += ["--config-file", str(ROOT / "pyproject.toml"), *targets]
    environment = {**os.environ, "MYPYPATH": str(view)}
    return subprocess.run(
        command, cwd=view, env=environment, capture_output=True, text=True, timeout=300
    )


def test_every_axis_and_its_call_sites_type_check(namespace_view: Path) -> None:
    checked = _mypy(namespace_view, *CHECKED)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_an_option_whose_factory_breaks_its_axis_contract_is_an_error(
    tmp_path: Path, namespace_view: Path
) -> None:
    module = tmp_path / "wrong_option.py"
    module.write_text(
        "from __future__ import annotations\n"
        "from typing import TYPE_CHECKING\n"
        "from servelab.strategies.kv.contiguous import ContiguousKVManager\n"
        "from servelab.strategies.registry import NoConfig, Option\n"
        "if TYPE_CHECKING:\n"
        "    from servelab.strategies.factories import KVOption\n"
        "def without_cache(config: NoConfig) -> ContiguousKVManager:\n"
        "    return ContiguousKVManager(8)\n"
        "WRONG: KVOption = Option(\n"
        "    'wrong', 'builds without the cache', NoConfig, without_cache\n"
        ")\n"
    )
    checked = _mypy(namespace_view, str(module))
    assert checked.returncode == 1
    assert 'to "Option" has incompatible type' in checked.stdout, checked.stdout
    assert 'expected "Callable[[Any, KVCache], KVManager]"' in checked.stdout
