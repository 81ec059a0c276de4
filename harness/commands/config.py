"""The Hydra config tree every verb composes, and the small argument helpers verbs share.

Each verb that needs configuration composes the same tree as a run, so every override works
the same way everywhere. Unknown preset names fail here with one line, before Hydra's
longer message.
"""

from __future__ import annotations

from omegaconf import DictConfig

from servelab.base.errors import ConfigError
from servelab.harness.runner.settings import CONF_DIR

GROUPS = ("model", "workload", "strategy")


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


def take_counts(args: list[str], defaults: dict[str, int]) -> tuple[dict[str, int], list[str]]:
    """Split a verb's own `name=N` arguments (positive integers) from the Hydra overrides."""
    numbers, rest = dict(defaults), []
    for arg in args:
        key, _, value = arg.partition("=")
        if key not in numbers:
            rest.append(arg)
        elif value.isdigit() and int(value) > 0:
            numbers[key] = int(value)
        else:
            raise ConfigError(key, f"{value!r} must be a positive whole number")
    return numbers, rest
