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
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from servelab.base.errors import ConfigError
from servelab.harness.run.compose import strategy_preset
from servelab.harness.run.servers.kinds import (
    HOST,
    ServerKind,
    check_model,
    kind_of,
    model_loaded,
)
from servelab.harness.run.servers.kv_flags import Budget, budget_flags
from servelab.harness.run.servers.strategy_flags import ENGINES, Translated, translate
from servelab.harness.run.settings import engine_settings
from servelab.models.load import model_config_of
from servelab.models.spec import ModelSpec

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
PLAIN_VALUE = re.compile(r"[\w./:+-]*")  # an override value Hydra reads as written


class ServerFailed(RuntimeError):
    """The server exited or did not answer before the run: one line, with its log's tail."""


@dataclass(frozen=True)
class ServerSettings:
    """The `server` node, checked: what to start and how long to wait on it."""

    kind: ServerKind
    executable: str
    flags: tuple[str, ...]  # the server's own flags, appended to its command line
    command: tuple[str, ...]  # kind=command: the whole command line, `{port}` in it
    strategy: str | None  # the strategy preset it serves (servelab's own, else as switches)
    translated: Translated  # the preset as the engine's switches (`strategy_flags`)
    budget: Budget  # the run's KV budget and dtype as its switches (`kv_flags`)
    passes: tuple[str, ...]  # servelab: the run's model and engine settings, as overrides
    model: str | None  # what the server loads; None: the run's own (`model_loaded`)
    run_model: ModelSpec
    health_path: str
    warmup: bool  # one short completion once it answers, before the run's clock
    start_timeout_s: float
    stop_timeout_s: float

    @property
    def label(self) -> str:
        """The server's name in reports: its kind (servelab's strategy) and flags."""
        if self.kind.name == "command":
            return " ".join([Path(self.command[0]).name, *self.command[1:]])
        name = self.kind.name if self.strategy is None else f"{self.kind.name}:{self.strategy}"
        return " ".join([name, *self.flags])

    def argv(self, port: int) -> list[str]:
        """The command line that starts it on `port`."""
        if self.kind.name == "command":
            return [part.replace("{port}", str(port)) for part in self.command]
        model = model_loaded(self.kind, self.model, self.run_model)
        head = self.kind.argv(self.executable, model, port)
        if self.kind.name == "servelab":
            head += [f"strategy={self.strategy}", *self.passes]
        return [*head, *self.translated.flags, *self.budget.flags, *self.flags]


def server_settings(cfg: DictConfig, run_model: ModelSpec) -> ServerSettings | None:
    """`cfg.server` checked, with one line naming the field at fault; None where it names no
    server (`server.kind` null)."""
    node = cfg.get("server") or {}
    if node.get("kind") is None:
        return None
    kind = kind_of(node.get("kind"))
    flags = _strings(node.get("flags"), "server.flags")
    command = _strings(node.get("command"), "server.command")
    if (kind.name == "command") != bool(command):
        raise ConfigError(
            "server.command",
            "server=command runs server.command (a list, {port} where the port goes)"
            if kind.name == "command"
            else f"server={kind.name} builds its own command line; add flags with server.flags",
        )
    if command and not any("{port}" in part for part in command):
        raise ConfigError("server.command", "say where the port goes: {port} in one argument")
    strategy = node.get("strategy")
    if strategy is None and kind.name == "servelab":
        raise ConfigError(
            "server.strategy", "servelab's server serves a preset: server.strategy=NAME"
        )
    if strategy is not None and kind.name == "command":
        raise ConfigError("server.strategy", "server=command runs server.command as it is given")
    translated = Translated((), ())
    if strategy is not None:
        preset = strategy_preset(str(strategy))  # an unknown name: one line, the known ones
        if kind.name in ENGINES:
            translated = translate(kind.name, str(strategy), preset, cfg.engine)
    budget = Budget((), None, ())
    if kind.name in ENGINES and _flag(node, "same_budget"):
        engine = engine_settings(cfg.engine)
        config = model_config_of(run_model)
        budget = budget_flags(
            kind.name, config, engine.dtype, engine.kv_budget_bytes, engine.device.type
        )
    executable = str(node.get("executable") or kind.executable or command[0])
    if shutil.which(executable) is None:
        raise ConfigError(
            "server.executable",
            f"{executable!r} is not an executable here: install {kind.name}'s server or name "
            "its path (server.executable=PATH)",
        )
    given = node.get("model")
    check_model(kind, None if given is None else str(given), run_model)
    health = str(node.get("health_path") or "")
    if not health.startswith("/"):
        raise ConfigError("server.health_path", f"{health!r} must be a path such as /health")
    timeouts = {key: node.get(key) for key in ("start_timeout_s", "stop_timeout_s")}
    for key, value in timeouts.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise ConfigError(f"server.{key}", f"{value!r} must be seconds > 0")
    passes = ()
    if kind.name == "servelab":
        passes = (
            f"model={cfg.model.name}",
            *_overrides("model", cfg.model),
            *_overrides("engine", cfg.engine),
        )
    return ServerSettings(
        kind=kind,
        executable=executable,
        flags=flags,
        command=command,
        strategy=None if strategy is None else str(strategy),
        translated=translated,
        budget=budget,
        passes=passes,
        model=None if given is None else str(given),
        run_model=run_model,
        health_path=health,
        warmup=bool(node.get("warmup", True)),
        start_timeout_s=float(timeouts["start_timeout_s"]),
        stop_timeout_s=float(timeouts["stop_timeout_s"]),
    )


def _flag(node: Mapping[str, Any], key: str) -> bool:
    value = node.get(key, True)
    if not isinstance(value, bool):
        raise ConfigError(f"server.{key}", f"{value!r} must be true or false")
    return value


def _strings(value: Any, field: str) -> tuple[str, ...]:
    """A list of strings from the config (Hydra reads `[a,b]`); every item as text."""
    if value is None:
        return ()
    items = OmegaConf.to_container(value) if OmegaConf.is_list(value) else value
    if not isinstance(items, list):
        raise ConfigError(field, f"{value!r} must be a list, e.g. {field}=[--a,1]")
    return tuple(str(item) for item in items)


def _overrides(prefix: str, node: Mapping[str, Any]) -> list[str]:
    """A config node's scalar keys as the overrides that set them in a server's config."""
    out = []
    for key, value in node.items():
        if isinstance(value, Mapping | list) or OmegaConf.is_config(value):
            continue
        text = (
            "null"
            if value is None
            else str(value).lower()
            if isinstance(value, bool)
            else str(value)
        )
        if not PLAIN_VALUE.fullmatch(text):
            text = "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
        out.append(f"{prefix}.{key}={text}")
    return out


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
