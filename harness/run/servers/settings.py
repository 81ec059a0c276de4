"""The `server` node, checked once before anything starts (`server_settings`): what a run or a
search contender starts (`managed`), on what command line, with which switches for the preset it
serves (`strategy_flags`) and for the run's KV budget (`kv_flags`), how long to wait on it."""

from __future__ import annotations

import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from servelab.base.errors import ConfigError
from servelab.harness.run.compose import strategy_preset
from servelab.harness.run.schema import checked
from servelab.harness.run.servers.kinds import (
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
from servelab.strategies.settings import strategy_settings

PLAIN_VALUE = re.compile(r"[\w./:+-]*")  # an override value Hydra reads as written


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
    flags = checked(node, "server.flags", [])
    command = checked(node, "server.command", [])
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
    # the run's engine settings: its batch limits and KV budget, as an engine's switches
    engine = engine_settings(cfg.engine) if kind.name in ENGINES else None
    translated = Translated((), ())
    if strategy is not None:
        preset = strategy_preset(str(strategy))  # an unknown name: one line, the known ones
        if engine is not None:
            translated = translate(kind.name, strategy_settings(preset), engine)
    budget = Budget((), None, ())
    if engine is not None and checked(node, "server.same_budget", True):
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
        warmup=checked(node, "server.warmup", True),
        start_timeout_s=float(checked(node, "server.start_timeout_s")),
        stop_timeout_s=float(checked(node, "server.stop_timeout_s")),
    )


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
