"""Whether an install is the locked one: the lock's hash, and each distribution that differs.

`make` installs servelab against one lock (`requirements/lock.txt`, from `make lock`): a
universal lock for Linux x86-64 on CPython 3.11 to 3.13, used as pip's constraints, so that an
install takes only the pins its machine needs (PyPI's CUDA torch brings its CUDA libraries at
their locked versions; a machine that offers torch's CPU build of the locked version takes that
build, which needs none) and a pin may hold for some Pythons only (its environment marker). A
figure is reproducible only where the install that produced it is known, so for every
distribution servelab runs on (its requirements, followed through the installed metadata)
this says where the installed version is not one the lock's pin accepts, and which are not in
the lock at all. meta.json records it; `python -m servelab.harness.checks.lock LOCK` checks an
install (`make` runs it after installing) and exits 1 naming each difference. Outside a
checkout (an installed wheel) there is no lock to compare with, and the record says so.
"""

from __future__ import annotations

import hashlib
import re
import sys
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement

LOCK = Path("requirements/lock.txt")
PROJECT = "servelab"


def canonical_name(name: str) -> str:
    """PEP 503's normal form: `Hydra_Core` and `hydra-core` are one distribution."""
    return re.sub(r"[-_.]+", "-", name).lower()


def locked_pins(text: str, environment: dict[str, str] | None = None) -> dict[str, Requirement]:
    """The `name==version` pins of a requirements-style lock that hold in `environment` (this
    interpreter's by default: a pin whose marker is false here is another Python's), by name."""
    pins: dict[str, Requirement] = {}
    for line in text.splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith(("#", "-")):
            continue
        try:
            pin = Requirement(line)
        except InvalidRequirement:
            continue
        exact = [spec for spec in pin.specifier if spec.operator == "=="]
        if exact and (pin.marker is None or pin.marker.evaluate(environment)):
            pins[canonical_name(pin.name)] = pin
    return pins


def installed_versions() -> dict[str, str]:
    """Every installed distribution's version, by canonical name."""
    found: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found.setdefault(canonical_name(name), dist.version)
    return found


def _requires(name: str, extras: frozenset[str]) -> list[tuple[str, frozenset[str]]]:
    """What installed distribution `name` with `extras` requires here: (name, extras) pairs."""
    found = []
    environment: dict[str, str] = dict(default_environment())
    for line in metadata.requires(name) or []:
        requirement = Requirement(line)
        marker = requirement.marker
        if marker is not None and not any(
            marker.evaluate({**environment, "extra": extra}) for extra in extras or {""}
        ):
            continue
        found.append((canonical_name(requirement.name), frozenset(requirement.extras)))
    return found


def runtime_closure(root: str = PROJECT, extras: frozenset[str] = frozenset({"test"})) -> set[str]:
    """The installed distributions `root` (with `extras`) runs on: its requirements, theirs, and
    so on, as the installed metadata says; a requirement not installed is left out (pip check
    names it)."""
    seen: set[str] = set()
    todo = [(canonical_name(root), extras)]
    done: set[tuple[str, frozenset[str]]] = set()
    while todo:
        name, wanted = todo.pop()
        if (name, wanted) in done:
            continue
        done.add((name, wanted))
        try:
            todo += _requires(name, wanted)
        except metadata.PackageNotFoundError:
            continue
        seen.add(name)
    seen.discard(canonical_name(root))
    return seen


def compare(
    pins: dict[str, Requirement], installed: dict[str, str], used: set[str]
) -> dict[str, dict[str, Any]]:
    """Each used distribution whose installed version the lock's pin does not accept, or that
    the lock does not name: {name: {locked, installed}} (locked None where unnamed)."""
    differs: dict[str, dict[str, Any]] = {}
    for name in sorted(used):
        pin = pins.get(name)
        version = installed.get(name)
        if pin is None or version is None or not pin.specifier.contains(version, prereleases=True):
            differs[name] = {"locked": str(pin.specifier) if pin else None, "installed": version}
    return differs


def install_differs(lock_text: str) -> dict[str, dict[str, Any]]:
    """What of this interpreter's install, servelab's requirements followed, the lock does not
    pin (`compare`)."""
    return compare(locked_pins(lock_text), installed_versions(), runtime_closure())


@cache
def lock_record(root: Path) -> dict[str, Any] | None:
    """The lock under `root`: its path, sha256, whether the install matches it, and what differs.
    None where `root` holds no lock (not a checkout)."""
    path = root / LOCK
    if not path.is_file():
        return None
    data = path.read_bytes()
    differs = install_differs(data.decode())
    return {
        "path": LOCK.as_posix(),
        "sha256": hashlib.sha256(data).hexdigest(),
        "matches": not differs,
        "differs": differs,
    }


def main(argv: list[str]) -> int:
    """Check this interpreter's install against the lock at argv[0]; 1 with a line a difference."""
    path = Path(argv[0]) if argv else LOCK
    differs = install_differs(path.read_text())
    for name, difference in differs.items():
        print(
            f"{name}: installed {difference['installed']}, locked "
            f"{difference['locked'] or 'nowhere (add it to pyproject.toml and make lock)'}",
            file=sys.stderr,
        )
    if differs:
        print(f"the install does not match {path}: `make lock`, or reinstall", file=sys.stderr)
    return 1 if differs else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
