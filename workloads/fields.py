"""Typed reads of one config node, each failing with a ConfigError that names the field.

Config nodes arrive as OmegaConf objects or plain dicts (tests build them directly). A
`Node` wraps one mapping and its dotted path (`workload.arrival`), rejects keys it does
not know (a typo would otherwise be silently ignored), and reads values with their type
and range checked, so every bad value is reported as `workload.arrival.rate: ...`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from servelab.base.errors import ConfigError


def plain(value: object) -> object:
    """An OmegaConf container as plain Python (interpolations resolved); others unchanged."""
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


@dataclass(frozen=True)
class Where:
    """A field and a place inside the file it names (`workload.path`, `a.jsonl line 3`)."""

    field: str
    place: str

    def error(self, message: str) -> ConfigError:
        return ConfigError(self.field, f"{self.place}: {message}")


@dataclass(frozen=True)
class Node:
    """One mapping of the config and where it sits (`workload.input_len`)."""

    values: Mapping[str, Any]
    path: str

    @staticmethod
    def of(value: object, path: str, known: Iterable[str]) -> Node:
        """Wrap a mapping (None counts as empty) after checking that every key is known."""
        value = plain(value)
        if value is None:
            value = {}
        if not isinstance(value, Mapping):
            raise ConfigError(path, f"expected a mapping of keys, got {value!r}")
        allowed = sorted(known)
        for key in value:
            if key not in allowed:
                raise ConfigError(
                    f"{path}.{key}", f"unknown key; the known keys are {', '.join(allowed)}"
                )
        return Node(values=value, path=path)

    def field(self, key: str) -> str:
        return f"{self.path}.{key}"

    def child(self, key: str, known: Iterable[str]) -> Node:
        return Node.of(self.values.get(key), self.field(key), known)

    def raw(self, key: str) -> object:
        return plain(self.values.get(key))

    def integer(self, key: str, default: int | None = None, minimum: int | None = None) -> int:
        value = self.optional_integer(key, minimum)
        if value is None:
            if default is None:
                raise ConfigError(self.field(key), "is required: set it to an integer")
            return default
        return value

    def optional_integer(self, key: str, minimum: int | None = None) -> int | None:
        value = self.values.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(self.field(key), f"expected an integer, got {value!r}")
        if minimum is not None and value < minimum:
            raise ConfigError(self.field(key), f"is {value}; it must be at least {minimum}")
        return value

    def number(self, key: str, default: float | None = None, minimum: float | None = None) -> float:
        value = self.optional_number(key, minimum)
        if value is None:
            if default is None:
                raise ConfigError(self.field(key), "is required: set it to a number")
            return default
        return value

    def positive(self, key: str, default: float | None = None) -> float:
        """A finite number above zero (rates, scales)."""
        value = self.number(key, default)
        if value <= 0:
            raise ConfigError(self.field(key), f"is {value}; it must be greater than 0")
        return value

    def optional_number(self, key: str, minimum: float | None = None) -> float | None:
        value = self.values.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(self.field(key), f"expected a number, got {value!r}")
        if not math.isfinite(value):
            raise ConfigError(self.field(key), f"is {value}; it must be a finite number")
        if minimum is not None and value < minimum:
            raise ConfigError(self.field(key), f"is {value}; it must be at least {minimum}")
        return float(value)

    def flag(self, key: str, default: bool) -> bool:
        value = self.values.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ConfigError(self.field(key), f"expected true or false, got {value!r}")
        return value

    def optional_text(self, key: str) -> str | None:
        value = self.values.get(key)
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            raise ConfigError(self.field(key), f"expected a non-empty string, got {value!r}")
        return value

    def choice(self, key: str, choices: Iterable[str], default: str | None = None) -> str:
        options = list(choices)
        value = self.optional_text(key)
        if value is None:
            if default is None:
                raise ConfigError(self.field(key), f"is required: one of {', '.join(options)}")
            return default
        if value not in options:
            raise ConfigError(
                self.field(key), f"unknown value {value!r}; use one of {', '.join(options)}"
            )
        return value
