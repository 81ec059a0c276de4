"""The strategy axes hold to their factory contracts (`strategies/factories.py`), checked by mypy.

Every option's `build`, every registry and every call that builds a strategy's parts is typed
by its axis's contract; a factory that takes other arguments, or a call site that passes
other ones, is a type error. The second test shows the check fails on such a mismatch.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECKED = ["strategies", "harness/engine", "harness/simulate", "harness/runner/build.py"]


def _mypy(*paths: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "mypy", "--no-incremental", "--no-error-summary", *paths]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_every_axis_and_its_call_sites_type_check() -> None:
    checked = _mypy(*CHECKED)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_an_option_whose_factory_breaks_its_axis_contract_is_an_error(tmp_path: Path) -> None:
    module = tmp_path / "wrong_option.py"
    module.write_text(
        "from __future__ import annotations\n"
        "from typing import TYPE_CHECKING\n"
        "from strategies.kv.contiguous import ContiguousKVManager\n"
        "from strategies.registry import NoConfig, Option\n"
        "if TYPE_CHECKING:\n"
        "    from strategies.factories import KVOption\n"
        "def without_cache(config: NoConfig) -> ContiguousKVManager:\n"
        "    return ContiguousKVManager(8)\n"
        "WRONG: KVOption = Option(\n"
        "    'wrong', 'builds without the cache', NoConfig, without_cache\n"
        ")\n"
    )
    checked = _mypy(str(module))
    assert checked.returncode == 1
    assert 'to "Option" has incompatible type' in checked.stdout, checked.stdout
    assert 'expected "Callable[[Any, KVCache], KVManager]"' in checked.stdout
