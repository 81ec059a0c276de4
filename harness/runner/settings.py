"""The typed, validated view of the `engine` config node every run shares.

Hydra gives a loose tree; `engine_settings` checks it once, before any work, and raises a
`ConfigError` that names the field and the fix. (The `strategy` node is read by the
strategy registries: `strategies.settings`.)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig

from harness.engine.kv_cache import parse_bytes
from harness.errors import ConfigError
from kernels.attention import IMPLS

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"  # the Hydra config tree and its presets
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# Measured on the 2-core development CPU (see the dtype note in README): bf16 is faster for
# batched steps; fp32 stays available and is what exactness checks use.
CPU_DEFAULT_DTYPE = "bf16"
FUSED_DECODE = ("auto", "off")
GPU_DEFAULT_DTYPE = "fp16"


@dataclass(frozen=True)
class EngineSettings:
    device: torch.device
    dtype: torch.dtype
    kv_budget_bytes: int | None  # None: a fraction of free device memory (kv_budget_fraction)
    kv_budget_fraction: float | None
    max_batch_size: int
    max_num_batched_tokens: int
    attention: str
    fused_decode: bool  # decode batches through the fused CPU layer where it applies
    seed: int


def _choice(node: DictConfig, key: str, allowed: tuple[str, ...], prefix: str) -> str:
    value = str(node.get(key))
    if value not in allowed:
        raise ConfigError(f"{prefix}.{key}", f"{value!r} is not one of: {', '.join(allowed)}")
    return value


def _positive_int(node: DictConfig, key: str, prefix: str) -> int:
    value = node.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{prefix}.{key}", f"{value!r} must be a positive integer")
    return value


def api_key_from_env(name: object, field: str) -> str | None:
    """The secret environment variable `name` holds (None when no name is given); the config
    names the variable, so the key itself is never written with a run."""
    if name is None:
        return None
    value = os.environ.get(str(name))
    if not value:
        raise ConfigError(field, f"environment variable {name} is not set; export it or use null")
    return value


def cache_dir_of(cfg: DictConfig) -> Path:
    """Where model files and measured machine peaks are cached (`engine.cache_dir`)."""
    return Path(str(cfg.engine.get("cache_dir", "~/.cache/servelab"))).expanduser()


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("engine.device", f"{name} asked for but no CUDA device; use cpu or auto")
    return torch.device(name)


def engine_settings(node: DictConfig) -> EngineSettings:
    device = resolve_device(str(node.get("device", "auto")))
    dtype_name = str(node.get("dtype", "auto"))
    if dtype_name == "auto":
        dtype_name = GPU_DEFAULT_DTYPE if device.type == "cuda" else CPU_DEFAULT_DTYPE
    if dtype_name not in DTYPES:
        raise ConfigError("engine.dtype", f"{dtype_name!r} is not one of auto, {', '.join(DTYPES)}")
    budget = node.get("kv_budget")
    fraction = None
    budget_bytes = None
    if isinstance(budget, float) and 0 < budget <= 1:
        if device.type != "cuda":
            raise ConfigError(
                "engine.kv_budget", "a fraction of free memory needs a GPU; give bytes like 256MiB"
            )
        fraction = budget
    else:
        budget_bytes = parse_bytes(budget)
    return EngineSettings(
        device=device,
        dtype=DTYPES[dtype_name],
        kv_budget_bytes=budget_bytes,
        kv_budget_fraction=fraction,
        max_batch_size=_positive_int(node, "max_batch_size", "engine"),
        max_num_batched_tokens=_positive_int(node, "max_num_batched_tokens", "engine"),
        attention=_choice(node, "attention", IMPLS, "engine"),
        fused_decode=_choice(node, "fused_decode", FUSED_DECODE, "engine") == "auto",
        seed=int(node.get("seed", 0)),
    )
