"""The lock record in meta.json: each lock's hash, and exactly which packages differ from it."""

from __future__ import annotations

import hashlib
from importlib import metadata
from pathlib import Path

from servelab.harness.measure.lock import (
    canonical_name,
    compare,
    lock_record,
    locked_versions,
)

LOCK_TEXT = """\
Hydra_Core==1.3.8
    # via servelab (pyproject.toml)
# a comment==1.0
torch==2.13.0+cpu
zope.interface==7.0
not-a-pin>=1
"""


def test_names_are_compared_in_their_canonical_form() -> None:
    assert canonical_name("Hydra_Core") == "hydra-core"
    assert canonical_name("zope.interface") == "zope-interface"


def test_only_exact_pins_are_read() -> None:
    assert locked_versions(LOCK_TEXT) == {
        "hydra-core": "1.3.8",
        "torch": "2.13.0+cpu",
        "zope-interface": "7.0",
    }


def test_compare_names_each_difference_and_each_missing_package() -> None:
    locked = {"hydra-core": "1.3.8", "torch": "2.13.0+cpu", "zope-interface": "7.0"}
    installed = {"hydra-core": "1.3.8", "torch": "2.14.1", "extra": "1"}
    assert compare(locked, installed) == {
        "torch": {"locked": "2.13.0+cpu", "installed": "2.14.1"},
        "zope-interface": {"locked": "7.0", "installed": None},
    }
    assert compare(locked, {**installed, "torch": "2.13.0+cpu", "zope-interface": "7.0"}) == {}


def test_lock_record_hashes_each_lock_and_checks_the_install(tmp_path: Path) -> None:
    pytest_version = metadata.version("pytest")
    (tmp_path / "requirements").mkdir()
    good = tmp_path / "requirements" / "a.txt"
    good.write_text(f"pytest=={pytest_version}\n")
    bad = tmp_path / "requirements" / "b.txt"
    bad.write_text(f"pytest=={pytest_version}\nno-such-package-here==1.0\n")
    assert lock_record(tmp_path) == {
        "requirements/a.txt": {
            "sha256": hashlib.sha256(good.read_bytes()).hexdigest(),
            "matches": True,
            "differs": {},
        },
        "requirements/b.txt": {
            "sha256": hashlib.sha256(bad.read_bytes()).hexdigest(),
            "matches": False,
            "differs": {"no-such-package-here": {"locked": "1.0", "installed": None}},
        },
    }


def test_no_lock_outside_a_checkout(tmp_path: Path) -> None:
    assert lock_record(tmp_path) is None
