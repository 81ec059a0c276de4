"""The Hydra config tree every command composes, and the configs made from a composed one.

Each command that needs configuration composes the same tree as a run, so every override
works the same way everywhere. Unknown preset names fail here with one line, before Hydra's
longer message, and so does a bad value of any declared field (`schema`), whichever verb.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from servelab.base.errors import ConfigError
from servelab.harness.run.schema import check
from servelab.harness.run.settings import CONF_DIR

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
    """The tree `overrides` compose, its declared fields checked (`schema`)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    check_group_choices(overrides)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = hydra_compose(config_name="config", overrides=overrides)
    check(cfg)
    return cfg


def strategy_preset(name: str) -> DictConfig:
    """A strategy preset's node as the run composes it (`strategy=NAME`), read from its file:
    the presets its defaults name first, itself over them. For a second strategy inside a
    run, where Hydra composes once."""
    path = CONF_DIR / "strategy" / f"{name}.yaml"
    if not path.is_file():
        check_group_choices([f"strategy={name}"])
    node = OmegaConf.load(path)
    assert isinstance(node, DictConfig)
    defaults = list(node.pop("defaults", None) or [])
    if "_self_" not in defaults:
        defaults.append("_self_")
    merged = OmegaConf.create()
    for parent in defaults:
        merged = OmegaConf.merge(merged, node if parent == "_self_" else strategy_preset(parent))
    assert isinstance(merged, DictConfig)
    return merged


def strategy_presets() -> dict[str, DictConfig]:
    """Every strategy preset by name, in name order."""
    names = sorted(p.stem for p in (CONF_DIR / "strategy").glob("*.yaml"))
    return {name: strategy_preset(name) for name in names}


def serving_weights(cfg: DictConfig, weights: str) -> DictConfig:
    """`cfg` serving `weights` as weights' quality is measured: in float32, without the
    roofline's peak measurement."""
    copy = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    copy.strategy.weights = weights
    copy.engine.dtype = "fp32"
    copy.telemetry.roofline = False
    return copy
