"""The config tree's scalar fields, each declared once with what it must be.

`compose` checks every declared field of a tree it composes (and a run's Hydra job the tree it
is given) before anything else, so a bad value anywhere, in a node the verb reads or not, is one
`ConfigError` line naming the field, before any work. The one function that types a node reads
a declared field through `checked`, so what a field must be is written here alone. The group
nodes (`model`, `workload`, `strategy`) and `slo` take their shape from their presets and are
read by their own parsers (the table in docs/DESIGN.md); so are the fields that parse text
(`engine.device`, `engine.dtype`, `engine.kv_budget`, `serve.max_body`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from servelab.base.errors import ConfigError
from servelab.kernels.attention import IMPLS


@dataclass(frozen=True)
class Field:
    """What a field's value must be: said in the error, and the test of it."""

    must: str
    accepts: Callable[[Any], bool]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def choice(*names: str) -> Field:
    return Field(f"one of: {', '.join(names)}", lambda value: value in names)


def or_null(field: Field) -> Field:
    return Field(f"{field.must} or null", lambda value: value is None or field.accepts(value))


FLAG = Field("true or false", lambda value: isinstance(value, bool))
INTEGER = Field("an integer", _is_int)
POSITIVE_INT = Field("a positive integer", lambda value: _is_int(value) and value > 0)
COUNT = Field("an integer >= 0", lambda value: _is_int(value) and value >= 0)
SECONDS = Field("seconds > 0", lambda value: _is_number(value) and value > 0)
SECONDS_OR_ZERO = Field("seconds >= 0", lambda value: _is_number(value) and value >= 0)
POSITIVE = Field("a number > 0", lambda value: _is_number(value) and value > 0)
NOT_NEGATIVE = Field("a number >= 0", lambda value: _is_number(value) and value >= 0)
SWITCH = choice("auto", "off")

SCHEMA: dict[str, Field] = {
    "engine.max_batch_size": POSITIVE_INT,
    "engine.max_num_batched_tokens": POSITIVE_INT,
    "engine.attention": choice(*IMPLS),
    "engine.fused_decode": SWITCH,
    "engine.cuda_graphs": SWITCH,
    "engine.seed": INTEGER,
    "engine.warmup": FLAG,
    "replay.skip_idle": FLAG,
    "telemetry.period_s": SECONDS,
    "telemetry.roofline": FLAG,
    "profile.enabled": FLAG,
    "profile.first_step": COUNT,
    "profile.num_steps": POSITIVE_INT,
    "endpoint.timeout_s": SECONDS,
    "endpoint.max_connections": POSITIVE_INT,
    "endpoint.workers": Field(
        "a positive integer or auto", lambda value: value == "auto" or POSITIVE_INT.accepts(value)
    ),
    "endpoint.metrics_period_s": or_null(SECONDS),
    "server.same_budget": FLAG,
    "server.warmup": FLAG,
    "server.start_timeout_s": SECONDS,
    "server.stop_timeout_s": SECONDS,
    "serve.port": Field(
        "a port number 0..65535 (0: any free)", lambda value: _is_int(value) and 0 <= value <= 65535
    ),
    "serve.shutdown_grace_s": SECONDS_OR_ZERO,
    "serve.max_concurrent_requests": POSITIVE_INT,
    "search.budget_s": SECONDS,
    "search.resolution": POSITIVE,
    "search.requests": POSITIVE_INT,
    "search.max_requests": POSITIVE_INT,
    "search.floor_requests": POSITIVE_INT,
    "search.ceiling_requests": POSITIVE_INT,
    "search.span": NOT_NEGATIVE,
    "search.warmup": NOT_NEGATIVE,
    "search.confidence": Field("in (0, 1)", lambda value: _is_number(value) and 0 < value < 1),
    "search.predict": FLAG,
    "plan.rate": POSITIVE,
    "plan.price_per_hour": NOT_NEGATIVE,
    "plan.memory_utilization": Field(
        "a share of device memory, in (0, 1]", lambda value: _is_number(value) and 0 < value <= 1
    ),
    "plan.requests": POSITIVE_INT,
}


def checked(node: Mapping[str, Any], path: str, default: Any = None) -> Any:
    """The declared field `path` read from `node`, its parent, and checked; `default` where
    the node does not hold it."""
    field = SCHEMA[path]
    found = node.get(path.rpartition(".")[2], default)
    if not field.accepts(found):
        raise ConfigError(path, f"{found!r} must be {field.must}")
    return found


def check(cfg: DictConfig) -> None:
    """Every declared field `cfg` holds, checked: the first bad one is one line."""
    for path in SCHEMA:
        parent, _, key = path.rpartition(".")
        node = OmegaConf.select(cfg, parent)
        if isinstance(node, DictConfig) and key in node:
            checked(node, path)
