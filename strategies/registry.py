"""Registries of strategy options: per axis, a name, a typed config and a factory for each option.

A strategy picks one option on each axis (`strategy.batching=iteration`, `strategy.kv=paged`,
...). Each option declares the keys it reads from the `strategy` config node as a frozen
dataclass; `Registry.choose` reads and checks them once, before any work, and raises a
`ConfigError` naming the field and the fix. The names a config accepts come from the
registries and nowhere else, so adding an option is one module and one registry entry.

Each axis's factory contract (what `build` takes after the config, and what it makes) is
written once, in `strategies.factories`, and each option is declared with it, so a type
checker holds every option's factory to its axis.

Config fields are plain `bool`, `int`, `float` or `str` (optionally `| None`); a field's
`metadata` may add `choices` (a tuple, or a callable returning one, for names that come from
another registry), `minimum` and `help` (one line saying what the key does). A config
class may define `check(self)` for rules that tie fields together.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import MISSING, Field, dataclass, fields
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar

from omegaconf import DictConfig

from servelab.base.errors import ConfigError

P = ParamSpec("P")  # what an axis builds its implementation from (`strategies.factories`)
T = TypeVar("T")  # what it builds


@dataclass(frozen=True)
class NoConfig:
    """The config of an option that reads no keys."""


@dataclass(frozen=True)
class Option(Generic[P, T]):
    """One choice on one axis: `build(config, *axis arguments)` makes the implementation; the
    axis's arguments and product are its factory contract (`strategies.factories`)."""

    name: str
    summary: str
    config: type
    build: Callable[Concatenate[Any, P], T]
    accepts: Callable[[str], bool] | None = None  # for parametric names such as gqa-N

    def matches(self, name: str) -> bool:
        return self.accepts(name) if self.accepts is not None else name == self.name


@dataclass(frozen=True)
class Choice(Generic[P, T]):
    """An option picked by a config, with its checked config values."""

    axis: str
    value: str  # the name as configured (`gqa-2` for the `gqa-N` option)
    option: Option[P, T]
    config: Any

    def build(self, *args: P.args, **kwargs: P.kwargs) -> T:
        return self.option.build(self.config, *args, **kwargs)

    def describe(self) -> dict[str, Any]:
        """The configured name and every key the option read, for records and reports."""
        values = {f.name: getattr(self.config, f.name) for f in fields(self.config)}
        return {self.axis: self.value, **values}


class Registry(Generic[P, T]):
    """The options of one axis, keyed by name."""

    def __init__(self, axis: str, options: Iterable[Option[P, T]]) -> None:
        self.axis = axis
        self.options: dict[str, Option[P, T]] = {}
        for option in options:
            if option.name in self.options:
                raise ValueError(f"{axis}: option {option.name!r} registered twice")
            self.options[option.name] = option

    def names(self) -> tuple[str, ...]:
        return tuple(self.options)

    def option(self, value: str) -> Option[P, T]:
        for option in self.options.values():
            if option.matches(value):
                return option
        raise ConfigError(f"strategy.{self.axis}", f"{value!r} is not one of: {self._listing()}")

    def _listing(self) -> str:
        return ", ".join(self.options)

    def choose(self, node: DictConfig | dict) -> Choice[P, T]:
        """The option `node[axis]` names, with its config read from the same node."""
        value = node.get(self.axis)
        if value is None:
            raise ConfigError(f"strategy.{self.axis}", f"not set; choose one of: {self._listing()}")
        option = self.option(str(value))
        return Choice(self.axis, str(value), option, read_config(option.config, node))


def read_config(cls: type, node: DictConfig | dict, prefix: str = "strategy") -> Any:
    """An instance of the dataclass `cls` from the keys of `node`, each checked."""
    hints = typing.get_type_hints(cls)
    values = {f.name: _read_field(f, hints[f.name], node, prefix) for f in fields(cls)}
    config = cls(**values)
    check = getattr(config, "check", None)
    if check is not None:
        check()
    return config


def _read_field(field: Field, hint: Any, node: DictConfig | dict, prefix: str) -> Any:
    name = f"{prefix}.{field.name}"
    default = field.default if field.default is not MISSING else None
    value = node.get(field.name, default)
    kinds = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    if value is None:
        if type(None) in kinds:
            return None
        raise ConfigError(name, "must be set")
    kind = next(k for k in kinds if k is not type(None))
    value = _coerce(name, value, kind)
    choices = field.metadata.get("choices")
    if callable(choices):
        choices = choices()
    if choices is not None and value not in choices:
        raise ConfigError(name, f"{value!r} is not one of: {', '.join(map(str, choices))}")
    minimum = field.metadata.get("minimum")
    if minimum is not None and value < minimum:
        raise ConfigError(name, f"{value!r} must be at least {minimum}")
    return value


def _coerce(name: str, value: Any, kind: type) -> Any:
    if kind is bool:
        if not isinstance(value, bool):
            raise ConfigError(name, f"{value!r} must be true or false")
        return value
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(name, f"{value!r} must be a whole number")
        return value
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(name, f"{value!r} must be a number")
        return float(value)
    return str(value)
