"""The small argument helpers verbs share (the config tree they compose:
`harness.run.compose`)."""

from __future__ import annotations

from servelab.base.errors import ConfigError


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
