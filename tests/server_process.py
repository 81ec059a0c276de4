"""Test helper: `servelab serve` as a real subprocess on a free loopback port
(`harness/serving/process.py`), run from the repository's root."""

from __future__ import annotations

from pathlib import Path

from servelab.harness.serving import process
from servelab.harness.serving.process import ServerProcess

ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 180.0

__all__ = ["ROOT", "ServerProcess", "start_server"]


def start_server(overrides: list[str], env: dict[str, str] | None = None) -> ServerProcess:
    """Start `servelab serve serve.port=0 OVERRIDES...` and wait for its address line."""
    return process.start_server(overrides, env, START_TIMEOUT_S, cwd=ROOT)
