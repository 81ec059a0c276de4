"""Test helper: `servelab serve` as a real subprocess on a free loopback port."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BANNER = "servelab: serving "
START_TIMEOUT_S = 180.0


@dataclass
class ServerProcess:
    process: subprocess.Popen[str]
    url: str
    output: list[str] = field(default_factory=list)

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 60.0) -> int:
        """Send `sig`, wait for the exit; the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(timeout_s)


def start_server(overrides: list[str], env: dict[str, str] | None = None) -> ServerProcess:
    """Start `servelab serve serve.port=0 OVERRIDES...` and wait for its address line."""
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    process = subprocess.Popen(
        [sys.executable, "-m", "servelab", "serve", "serve.port=0", *overrides],
        cwd=ROOT,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.SimpleQueue[str | None] = queue.SimpleQueue()
    output: list[str] = []

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            output.append(line)
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1.0)
        except queue.Empty:
            continue
        if line is None:
            break
        if line.startswith(BANNER):
            return ServerProcess(process, line.rsplit(" at ", 1)[1].strip(), output)
    process.kill()
    raise RuntimeError("servelab serve did not start:\n" + "".join(output))
