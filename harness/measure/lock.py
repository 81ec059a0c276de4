"""Which dependency lock a run's install matches: the lock files' hashes, and what differs.

`make` installs every dependency at the exact version of a lock (`requirements/*.txt`, from
`make lock`); a figure is reproducible only where the install that produced it is known. For
each lock file of the checkout this says its sha256 and, package by package, where the
installed version differs from the locked one (or the package is missing), so meta.json tells
a locked install from a hand-made one. Outside a checkout (an installed wheel) there is no
lock to compare with, and the record says so.
"""

from __future__ import annotations

import hashlib
import re
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")


def canonical_name(name: str) -> str:
    """PEP 503's normal form: `Hydra_Core` and `hydra-core` are one distribution."""
    return re.sub(r"[-_.]+", "-", name).lower()


def locked_versions(text: str) -> dict[str, str]:
    """The `name==version` pins of a requirements-style lock, by canonical name."""
    pins = (PIN.match(line.strip()) for line in text.splitlines())
    return {canonical_name(pin[1]): pin[2] for pin in pins if pin}


def installed_versions() -> dict[str, str]:
    """Every installed distribution's version, by canonical name."""
    found: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found.setdefault(canonical_name(name), dist.version)
    return found


def compare(locked: dict[str, str], installed: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Each locked package whose installed version differs: {name: {locked, installed}}."""
    return {
        name: {"locked": version, "installed": installed.get(name)}
        for name, version in sorted(locked.items())
        if installed.get(name) != version
    }


@cache
def lock_record(root: Path) -> dict[str, Any] | None:
    """For each `requirements/*.txt` under `root`: its sha256, whether the install matches it,
    and what differs. None where `root` holds no lock (not a checkout)."""
    files = sorted((root / "requirements").glob("*.txt"))
    if not files:
        return None
    installed = installed_versions()
    record: dict[str, Any] = {}
    for path in files:
        data = path.read_bytes()
        differs = compare(locked_versions(data.decode()), installed)
        record[path.relative_to(root).as_posix()] = {
            "sha256": hashlib.sha256(data).hexdigest(),
            "matches": not differs,
            "differs": differs,
        }
    return record
