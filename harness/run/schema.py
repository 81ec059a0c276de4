"""Every field of the config tree's own nodes, declared once with what it must be.

`compose` checks every declared field of a tree it composes (and a run's Hydra job the tree it
is given) before anything else, so a bad value anywhere, in a node the verb reads or not, is one
`ConfigError` line naming the field, before any work. The one function that types a node reads
a declared field through `checked`, which also gives it as what it stands for (one preset name
for a list of names is a list of one). The group nodes (`model`, `workload`, `strategy`) and
`slo` take their shape from their presets and are read by their own parsers (the table in
docs/DESIGN.md); a field whose text names something (a device, a dtype, a size, a backend, a
server kind) is declared as text here and parsed by its reader, named beside it.
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
    """What a field's value must be (said in the error), the test of it, and what its reader
    gets: the value, or the value made what it stands for (`read`)."""

    must: str
    accepts: Callable[[Any], bool]
    read: Callable[[Any], Any] = lambda value: value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_list(value: Any) -> bool:
    return isinstance(value, list) or OmegaConf.is_list(value)


def choice(*names: str) -> Field:
    return Field(f"one of: {', '.join(names)}", lambda value: value in names)


def or_null(field: Field) -> Field:
    return Field(
        f"{field.must} or null",
        lambda value: value is None or field.accepts(value),
        lambda value: None if value is None else field.read(value),
    )


FLAG = Field("true or false", lambda value: isinstance(value, bool))
INTEGER = Field("an integer", _is_int)
POSITIVE_INT = Field("a positive integer", lambda value: _is_int(value) and value > 0)
COUNT = Field("an integer >= 0", lambda value: _is_int(value) and value >= 0)
SECONDS = Field("seconds > 0", lambda value: _is_number(value) and value > 0)
SECONDS_OR_ZERO = Field("seconds >= 0", lambda value: _is_number(value) and value >= 0)
POSITIVE = Field("a number > 0", lambda value: _is_number(value) and value > 0)
NOT_NEGATIVE = Field("a number >= 0", lambda value: _is_number(value) and value >= 0)
SWITCH = choice("auto", "off")
TEXT = Field("text", lambda value: isinstance(value, str) or _is_number(value), str)
SIZE = Field(  # parsed by engine.kv_cache.parse_bytes
    "a size such as 256MiB", lambda value: isinstance(value, str) or _is_number(value)
)
STRINGS = Field(  # a command line's words
    "a list, e.g. [--a,1]", _is_list, lambda value: tuple(str(item) for item in value)
)
NAMES = Field(  # presets: one name stands for a list of one
    "a name or a list of names, e.g. [a,b]",
    lambda value: isinstance(value, str) or _is_list(value),
    lambda value: (value,) if isinstance(value, str) else tuple(str(item) for item in value),
)
MAPPING = Field(
    "a mapping, e.g. {a: 1}",
    lambda value: isinstance(value, dict | DictConfig),
    lambda value: (
        OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else dict(value)
    ),
)

SCHEMA: dict[str, Field] = {
    "backend": TEXT,  # one of harness/run/backends' KINDS (`backend_of`)
    "engine.device": TEXT,  # auto, cpu, cuda, cuda:N (`resolve_device`)
    "engine.dtype": TEXT,  # auto or one of DTYPES (`choose_dtype`)
    "engine.kv_budget": SIZE,  # or a fraction of free GPU memory (`engine_settings`)
    "engine.cache_dir": TEXT,
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
    "simulate.cost_model": or_null(TEXT),
    "simulate.hardware": or_null(TEXT),
    "endpoint.url": TEXT,
    "endpoint.model": or_null(TEXT),
    "endpoint.label": or_null(TEXT),
    "endpoint.api_key_env": or_null(TEXT),
    "endpoint.extra_body": MAPPING,
    "endpoint.timeout_s": SECONDS,
    "endpoint.max_connections": POSITIVE_INT,
    "endpoint.workers": Field(
        "a positive integer or auto", lambda value: value == "auto" or POSITIVE_INT.accepts(value)
    ),
    "endpoint.metrics_period_s": or_null(SECONDS),
    "server.kind": or_null(TEXT),  # harness/run/servers/kinds.py (`kind_of`)
    "server.strategy": or_null(TEXT),
    "server.flags": STRINGS,
    "server.command": STRINGS,
    "server.model": or_null(TEXT),
    "server.executable": or_null(TEXT),
    "server.health_path": TEXT,
    "server.same_budget": FLAG,
    "server.warmup": FLAG,
    "server.start_timeout_s": SECONDS,
    "server.stop_timeout_s": SECONDS,
    "serve.host": TEXT,
    "serve.model_name": or_null(TEXT),
    "serve.api_key_env": or_null(TEXT),
    "serve.record_dir": or_null(TEXT),
    "serve.max_body": SIZE,
    "serve.port": Field(
        "a port number 0..65535 (0: any free)", lambda value: _is_int(value) and 0 <= value <= 65535
    ),
    "serve.shutdown_grace_s": SECONDS_OR_ZERO,
    "serve.max_concurrent_requests": POSITIVE_INT,
    "search.strategies": NAMES,
    "search.reference": or_null(TEXT),
    "search.slo_scale": MAPPING,
    "search.slo_from": or_null(TEXT),
    "search.out_dir": TEXT,
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
    "plan.hardware": NAMES,
    "plan.profiles": MAPPING,
    "plan.strategies": NAMES,
    "plan.engine": MAPPING,  # the engine node's fields for the simulated runs
    "plan.out_dir": TEXT,
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
    return field.read(found)


def check(cfg: DictConfig) -> None:
    """Every declared field `cfg` holds, checked: the first bad one is one line."""
    for path in SCHEMA:
        parent, _, key = path.rpartition(".")
        node = OmegaConf.select(cfg, parent) if parent else cfg
        if isinstance(node, DictConfig) and key in node:
            checked(node, path)
