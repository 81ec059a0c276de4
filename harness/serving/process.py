"""A server as a child process, for whatever drives a server it did not start in process (the
GPU check's serve step, the load generator's self-benchmark, the serving tests): started on a
free loopback port, its URL read from the line it prints once it listens (`... at URL`), its
output kept: `servelab serve` (`start_server`) or the fake server (`start_fake_server`)."""

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

from servelab.harness.serving import fake_server
from servelab.harness.serving.server import BANNER


@dataclass
class ServerProcess:
    process: subprocess.Popen[str]
    url: str
    output: list[str] = field(default_factory=list)

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 60.0) -> int:
        """Send `sig`, wait for the exit (killing it past `timeout_s`); the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


def start_server(
    overrides: list[str],
    env: dict[str, str] | None = None,
    start_s: float = 180.0,
    log: Path | None = None,
    cwd: Path | None = None,
) -> ServerProcess:
    """Start `servelab serve serve.port=0 OVERRIDES...` and wait for its address line."""
    command = [sys.executable, "-m", "servelab", "serve", "serve.port=0", *overrides]
    return start_process(command, BANNER, env, start_s, log, cwd)


def start_fake_server(tokens: int, start_s: float = 60.0) -> ServerProcess:
    """Start the fake server (`fake_server`), streaming `tokens` tokens a completion."""
    command = [sys.executable, "-m", fake_server.__name__, "--tokens", str(tokens)]
    return start_process(command, fake_server.BANNER, None, start_s, None, None)


def start_process(
    command: list[str],
    banner: str,
    env: dict[str, str] | None,
    start_s: float,
    log: Path | None,
    cwd: Path | None,
) -> ServerProcess:
    """Start `command` and wait for its line starting with `banner` and ending `at URL`;
    every line it prints kept (and copied to `log`). RuntimeError when it does not start."""
    process = subprocess.Popen(
        command, cwd=cwd, env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines: queue.SimpleQueue[str | None] = queue.SimpleQueue()
    output: list[str] = []

    def read() -> None:
        assert process.stdout is not None
        with open(log or os.devnull, "w") as copy:
            for line in process.stdout:
                output.append(line)
                copy.write(line)
                copy.flush()
                lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + start_s
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1.0)
        except queue.Empty:
            continue
        if line is None:
            break
        if line.startswith(banner):
            return ServerProcess(process, line.rsplit(" at ", 1)[1].strip(), output)
    process.kill()
    name = " ".join(command[1:4])
    raise RuntimeError(f"{name} did not start within {start_s:.0f} s:\n" + "".join(output))
