"""The lock record in meta.json and the install's check: the lock's hash, and exactly which
distributions servelab runs on differ from it."""

from __future__ import annotations

import hashlib
from importlib import metadata
from pathlib import Path

import pytest

from servelab.harness.checks.lock import (
    LOCK,
    canonical_name,
    compare,
    installed_versions,
    lock_record,
    locked_pins,
    main,
    runtime_closure,
)

LOCK_TEXT = """\
Hydra_Core==1.3.8
    # via servelab (pyproject.toml)
# a comment==1.0
torch==2.13.0
zope.interface==7.0
numpy==2.4.6 ; python_full_version < '3.12'
numpy==2.5.5 ; python_full_version >= '3.12'
nvidia-cublas==13.1.1.3 ; sys_platform == 'linux'
not-a-pin>=1
"""
PY311 = {"python_full_version": "3.11.7", "python_version": "3.11", "sys_platform": "linux"}
PY312 = {**PY311, "python_full_version": "3.12.1", "python_version": "3.12"}


def versions(pins: dict) -> dict[str, str]:
    return {name: str(pin.specifier) for name, pin in pins.items()}


def test_names_are_compared_in_their_canonical_form() -> None:
    assert canonical_name("Hydra_Core") == "hydra-core"
    assert canonical_name("zope.interface") == "zope-interface"


def test_only_exact_pins_whose_marker_holds_are_read() -> None:
    assert versions(locked_pins(LOCK_TEXT, PY311)) == {
        "hydra-core": "==1.3.8",
        "torch": "==2.13.0",
        "zope-interface": "==7.0",
        "numpy": "==2.4.6",
        "nvidia-cublas": "==13.1.1.3",
    }
    assert versions(locked_pins(LOCK_TEXT, PY312))["numpy"] == "==2.5.5"
    assert "nvidia-cublas" not in locked_pins(LOCK_TEXT, {**PY311, "sys_platform": "darwin"})


def test_compare_names_each_difference_and_each_unlocked_distribution() -> None:
    pins = locked_pins(LOCK_TEXT, PY311)
    installed = {"hydra-core": "1.3.8", "torch": "2.14.1", "numpy": "2.5.5", "extra": "1"}
    used = {"hydra-core", "torch", "numpy", "extra"}
    assert compare(pins, installed, used) == {
        "torch": {"locked": "==2.13.0", "installed": "2.14.1"},
        "numpy": {"locked": "==2.4.6", "installed": "2.5.5"},
        "extra": {"locked": None, "installed": "1"},
    }


def test_a_local_build_of_the_locked_version_matches_and_unused_pins_are_not_asked_for() -> None:
    """torch's CPU build (a local label) is the locked version; the CUDA libraries only its CUDA
    build needs, and a distribution nothing uses, are not required by the check."""
    pins = locked_pins(LOCK_TEXT, PY311)
    installed = {"hydra-core": "1.3.8", "torch": "2.13.0+cpu", "numpy": "2.4.6", "extra": "1"}
    assert compare(pins, installed, {"hydra-core", "torch", "numpy"}) == {}


def test_the_closure_follows_requirements_with_their_extras() -> None:
    """servelab with its test extra runs on pytest and torch; pytest runs on pluggy."""
    used = runtime_closure()
    assert {"torch", "pytest", "pluggy", "hydra-core", "omegaconf"} <= used
    assert "servelab" not in used
    assert "pytest" not in runtime_closure(extras=frozenset())


def test_lock_record_hashes_the_lock_and_checks_the_install(tmp_path: Path) -> None:
    (tmp_path / LOCK).parent.mkdir(parents=True)
    installed = installed_versions()
    pins = "".join(f"{name}=={installed[name]}\n" for name in sorted(runtime_closure()))
    (tmp_path / LOCK).write_text(pins)
    assert lock_record(tmp_path) == {
        "path": "requirements/lock.txt",
        "sha256": hashlib.sha256(pins.encode()).hexdigest(),
        "matches": True,
        "differs": {},
    }
    other = tmp_path / "other"
    (other / LOCK).parent.mkdir(parents=True)
    (other / LOCK).write_text(pins.replace(f"pytest=={metadata.version('pytest')}", "pytest==1.0"))
    record = lock_record(other)
    assert record is not None and not record["matches"]
    assert record["differs"] == {
        "pytest": {"locked": "==1.0", "installed": metadata.version("pytest")}
    }


def test_the_install_check_names_each_difference(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lock = tmp_path / "lock.txt"
    lock.write_text(f"pytest=={metadata.version('pytest')}\n")
    assert main([str(lock)]) == 1
    err = capsys.readouterr().err
    assert "torch: installed" in err and "locked nowhere" in err
    assert "pytest:" not in err


def test_no_lock_outside_a_checkout(tmp_path: Path) -> None:
    assert lock_record(tmp_path) is None
