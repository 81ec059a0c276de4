"""The Hydra config tree every command composes, and the configs made from a composed one.

Each command that needs configuration composes the same tree as a run, so every override
works the same way everywhere. Unknown preset names fail here with one line, before Hydra's
longer message.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from servelab.base.errors import ConfigError
from servelab.harness.runner.settings import CONF_DIR

GROUPS = ("model", "workload", "strategy", "server")


def _served(server: str | None, strategy: str) -> str:
    """What serves a run, as its directory is named: the server it starts, else its strategy."""
    return strategy if server is None else server


OmegaConf.register_new_resolver("served", _served, replace=True)


def check_group_choices(overrides: list[str]) -> None:
    """One line for an unknown preset name (`strategy=nope`)."""
    for override in overrides:
        key, _, value = override.lstrip("+~").partition("=")
        if key not in GROUPS or not value or "," in value:
            continue
        if not (CONF_DIR / key / f"{value}.yaml").is_file():
            known = ", ".join(sorted(p.stem for p in (CONF_DIR / key).glob("*.yaml")))
            raise ConfigError(key, f"unknown preset {value!r}; choose one of: {known}")


def compose(overrides: list[str]) -> DictConfig:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    check_group_choices(overrides)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return hydra_compose(config_name="config", overrides=overrides)


def serving_weights(cfg: DictConfig, weights: str) -> DictConfig:
    """`cfg` serving `weights` as weights' quality is measured: in float32, without the
    roofline's peak measurement."""
    copy = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    copy.strategy.weights = weights
    copy.engine.dtype = "fp32"
    copy.telemetry.roofline = False
    return copy
