"""A server the run starts itself (`server=servelab|vllm|sglang|llamacpp|command`), so that a
sweep over a server's flags measures each flag set from a clean server (no prefix cache, no
queue left by the last run) and no person starts or stops anything. `server.strategy` names the
preset it serves: servelab's own, or for vLLM, SGLang and llama.cpp the preset as their own
switches (`strategy_flags`), put before `server.flags`.

Before the run's clock: the server starts on a free loopback port (`kinds` builds its
command line, `server.flags` appended), in its own process group, and the run waits until its
health path answers 200, at most `server.start_timeout_s`, then sends it one short completion
(`server.warmup`); a server that exits first, does not answer in time or fails the warm-up is
stopped and the run ends with one line carrying its last log lines.
After the run, whatever ended it (its end, an error, Ctrl-C, SIGTERM), the whole process group
gets SIGTERM, then SIGKILL past `server.stop_timeout_s`; a server whose parent dies unasked is
sent SIGTERM by the kernel (Linux). The run directory keeps `server.log` (everything it
printed) and `server.json` (kind, command line, flags, version, the environment variables a
server reads its settings from, URL, pid, start-up time, exit status), so every run is
reproducible from its record.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servelab.harness.run.servers.kinds import (
    HOST,
)
from servelab.harness.run.servers.settings import ServerSettings

LOG = "server.log"
RECORD = "server.json"
WARMUP_PROMPT = "The weather today is"  # server.warmup's completion, before the run's clock
TAIL_LINES = 4  # of the server's log, in the one-line error when it fails to start
ERROR_LINE = re.compile(r"\b\w*(Error|Exception): ")  # an exception's own line, in a log
POLL_S = 0.2  # between two health checks
# the environment a server reads its settings from (VLLM_CPU_KVCACHE_SPACE, OMP_NUM_THREADS, ...),
# recorded with it
SETTINGS_ENV = ("VLLM_", "SGLANG_", "SGL_", "LLAMA_", "GGML_", "OMP_", "MKL_", "CUDA_VISIBLE",
                "HF_", "SERVELAB_")  # fmt: skip


class ServerFailed(RuntimeError):
    """The server exited or did not answer before the run: one line, with its log's tail."""


def free_port() -> int:
    """A loopback port nothing listens on now (the server binds it a moment later)."""
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


def version_of(settings: ServerSettings) -> str | None:
    """The server's version as its own command prints it (None where it has none)."""
    if settings.kind.version is None:
        return None
    try:
        done = subprocess.run(
            settings.kind.version(settings.executable), capture_output=True, text=True,
            timeout=60, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"unknown ({type(error).__name__})"
    lines = [line.strip() for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    said = next((line for line in lines if "version" in line.lower()), lines[0] if lines else "")
    return said or f"unknown (exit {done.returncode})"


@dataclass(frozen=True)
class RunningServer:
    """A started server, healthy when handed out: where it answers, and whether it still runs."""

    url: str  # its base URL
    settings: ServerSettings
    process: subprocess.Popen
    log: Path

    def exit_status(self) -> int | None:
        """Its exit status once it has exited (None while it runs)."""
        return self.process.poll()

    def warm_up(self) -> float:
        """One short completion (`server.warmup`), untimed by a run: its seconds."""
        return _warm_up(self.url, self.settings, self.log)


@contextmanager
def running_server(
    settings: ServerSettings, run_dir: Path, say: Callable[[str], None]
) -> Iterator[RunningServer]:
    """The server started, healthy, for the body; stopped and recorded after."""
    port = free_port()
    url = f"http://{HOST}:{port}"
    argv = settings.argv(port)
    run_dir.mkdir(parents=True, exist_ok=True)
    log_path = run_dir / LOG
    record: dict[str, Any] = {
        "kind": settings.kind.name, "label": settings.label, "command": argv,
        "flags": list(settings.flags), "strategy": settings.strategy,
        "strategy_flags": list(settings.translated.flags),
        "budget_flags": list(settings.budget.flags), "kv_tokens": settings.budget.kv_tokens,
        "notes": [*settings.translated.notes, *settings.budget.notes],
        "version": version_of(settings), "url": url, "health_path": settings.health_path,
        "environment": {k: v for k, v in sorted(os.environ.items()) if k.startswith(SETTINGS_ENV)},
    }  # fmt: skip
    say(f"server: starting {settings.label} at {url} (log {log_path})")
    for note in settings.translated.notes:
        say(f"server: {settings.kind.name} serves {settings.strategy} its own way: {note}")
    for note in settings.budget.notes:
        say(f"server: {settings.kind.name}: {note}")
    begun = time.monotonic()
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, preexec_fn=_ended_with_parent,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
    record["pid"] = process.pid
    _write(run_dir, record)
    server = RunningServer(url, settings, process, log_path)
    with sigterm_exits():
        try:
            _wait_healthy(process, url + settings.health_path, settings, log_path, begun)
            record["startup_s"] = time.monotonic() - begun
            if settings.warmup:
                record["warmup_s"] = server.warm_up()
            _write(run_dir, record)
            say(f"server: {settings.label} answered {settings.health_path} after "
                f"{record['startup_s']:.1f} s")  # fmt: skip
            yield server
        finally:
            record["exit_status"] = stop_group(process, settings.stop_timeout_s)
            record["stopped_after_s"] = time.monotonic() - begun
            _write(run_dir, record)


def _wait_healthy(
    process: subprocess.Popen, health_url: str, settings: ServerSettings, log: Path, begun: float
) -> None:
    """Until `health_url` answers 200; ServerFailed (the server stopped) when it exits first
    or the start-up limit passes."""
    deadline = begun + settings.start_timeout_s
    while True:
        status = process.poll()
        if status is not None:
            raise ServerFailed(
                f"server {settings.label} exited with status {status} after "
                f"{time.monotonic() - begun:.1f} s, before {settings.health_path} answered; "
                + _tail(log)
            )
        try:
            with urllib.request.urlopen(health_url, timeout=POLL_S * 10) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            pass
        if time.monotonic() > deadline:
            stop_group(process, settings.stop_timeout_s)
            raise ServerFailed(
                f"server {settings.label} did not answer {settings.health_path} within "
                f"{settings.start_timeout_s:g} s (server.start_timeout_s), stopped; " + _tail(log)
            )
        time.sleep(POLL_S)


def _warm_up(url: str, settings: ServerSettings, log: Path) -> float:
    """One short greedy completion, untimed by the run: whatever a server does lazily on its
    first request (a kernel compiled, a pool grown) is done before the clock; its seconds."""
    begun = time.monotonic()
    try:
        with urllib.request.urlopen(url + "/v1/models", timeout=60) as answer:
            model = json.load(answer)["data"][0]["id"]
        body = {"model": model, "prompt": WARMUP_PROMPT, "max_tokens": 8, "temperature": 0}
        request = urllib.request.Request(
            url + "/v1/completions", json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=settings.start_timeout_s) as answer:
            answer.read()
    except (OSError, ValueError, KeyError, IndexError) as error:
        raise ServerFailed(
            f"server {settings.label} answered {settings.health_path} but not its warm-up "
            f"completion ({type(error).__name__}: {error}); " + _tail(log)
        ) from error
    return time.monotonic() - begun


def stop_group(process: subprocess.Popen, timeout_s: float) -> int:
    """SIGTERM to the server's process group, SIGKILL past `timeout_s`; its exit status."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)
        try:
            return process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            continue
    return process.wait()


def _tail(log: Path) -> str:
    """The server's last words: the last error line it printed (an exception's `...Error: ...`,
    often above a screen of shutdown warnings), then its last lines."""
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    if not lines:
        return f"it printed nothing ({log})"
    errors = [line for line in lines if ERROR_LINE.search(line)]
    said = f"its error: {errors[-1]}; " if errors and errors[-1] not in lines[-TAIL_LINES:] else ""
    return said + f"its last lines ({log}): " + " | ".join(lines[-TAIL_LINES:])


def _write(run_dir: Path, record: dict) -> None:
    (run_dir / RECORD).write_text(json.dumps(record, indent=2) + "\n")


def _ended_with_parent() -> None:
    """In the child before it runs: SIGTERM when this process dies (Linux's PDEATHSIG)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _exit(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


@contextmanager
def sigterm_exits() -> Iterator[None]:
    """For the body, SIGTERM to this process ends it through its cleanup (every server it
    started stopped), as Ctrl-C does; the previous handler back after. Nested, the outermost
    holds it: a search keeps it while its servers start and stop in any order."""
    if (
        sys.platform == "win32"
        or threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) is _exit
    ):
        yield
        return
    previous = signal.signal(signal.SIGTERM, _exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
