"""The typed, validated view of the `engine` config node every run shares.

Hydra gives a loose tree; `engine_settings` checks it once, before any work, and raises a
`ConfigError` that names the field and the fix. (The `strategy` node is read by the
strategy registries: `strategies.settings`.)
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig

from servelab.base.errors import ConfigError
from servelab.engine.kv_cache import parse_bytes
from servelab.harness.run.schema import checked
from servelab.kernels.capabilities import capabilities
from servelab.models.spec import ModelSpec, model_spec

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"  # the Hydra config tree and its presets
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def dtype_name(dtype: torch.dtype) -> str:
    """The config's name of a dtype (`engine.dtype`)."""
    return {v: k for k, v in DTYPES.items()}[dtype]


GPU_DEFAULT_DTYPE = "bf16"  # the model's own dtype, and every CPU figure's where bf16 is native

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineSettings:
    device: torch.device
    dtype: torch.dtype
    dtype_reason: str  # why this dtype: the machine's native products, or as configured
    kv_budget_bytes: int | None  # None: a fraction of free device memory (kv_budget_fraction)
    kv_budget_fraction: float | None
    max_batch_size: int
    max_num_batched_tokens: int
    attention: str
    fused_decode: bool  # the fused layers where they apply (models/fused_decode.py, gpu_layers.py)
    cuda_graphs: bool  # decode steps replayed from CUDA graphs where they apply
    seed: int
    warmup: bool  # each step-shape bucket run once before the measured window
    device_fallback: str | None = None  # why engine.device=auto runs on the CPU beside a GPU


def device_line(settings: EngineSettings) -> str:
    """Where a run computes, said before its first step: the device (a GPU by its name), the
    dtype and why, and why a visible GPU is not used."""
    device = settings.device
    if device.type == "cuda":
        where = f"{device} ({torch.cuda.get_device_name(device)})"
    else:
        caps = capabilities()
        why = "engine.device=cpu" if torch.cuda.is_available() else "no CUDA device"
        where = f"cpu ({caps.machine} at {caps.level}; {why})"
    dtype = next(name for name, value in DTYPES.items() if value == settings.dtype)
    fallback = f"; {settings.device_fallback}" if settings.device_fallback else ""
    return f"device: {where}, {dtype} ({settings.dtype_reason}){fallback}"


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


def model_of(cfg: DictConfig) -> ModelSpec:
    """The run's model (`model`), checked, cached under `engine.cache_dir`."""
    return model_spec(cfg.model, cache_dir_of(cfg))


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        note = cpu_fallback_note()
        if note is not None:
            log.warning("engine.device=auto: %s", note)
        return torch.device("cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("engine.device", f"{name} asked for but no CUDA device; use cpu or auto")
    return torch.device(name)


def cpu_fallback_note() -> str | None:
    """Why `auto` runs on the CPU although the host shows a GPU (None when it shows none)."""
    if not capabilities().gpu_visible:
        return None
    build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "a CPU-only build"
    return (
        f"a GPU is visible (nvidia-smi or /dev/nvidia*) but torch {torch.__version__} ({build}) "
        "finds no usable CUDA device; running on the CPU"
    )


def choose_dtype(name: str, device: torch.device) -> tuple[str, str]:
    """(`engine.dtype` resolved, why). On a CPU `auto` is bf16 only where the CPU multiplies
    bf16 in hardware (AVX-512 BF16 or AMX, within the ISA level): elsewhere torch widens bf16
    element by element (0.3 GFLOP/s measured on an AVX2-only Zen 3, against 160 in fp32)."""
    if name not in ("auto", *DTYPES):
        raise ConfigError("engine.dtype", f"{name!r} is not one of auto, {', '.join(DTYPES)}")
    if device.type == "cuda":
        if name == "auto":
            return GPU_DEFAULT_DTYPE, "auto: the GPU default, the model's own dtype"
        return name, "set"
    caps = capabilities()
    native = {"bf16": caps.bf16_native, "fp16": caps.fp16_native, "fp32": True}
    if name == "auto":
        if caps.bf16_native:
            return "bf16", f"auto: this CPU multiplies bf16 natively (level {caps.level})"
        return "fp32", (
            f"auto: no native bf16 product at level {caps.level} (needs AVX-512 BF16 or AMX); "
            "bf16 would be emulated"
        )
    if native[name]:
        return name, "set"
    note = (
        f"set; this CPU has no native {name} product at level {caps.level}: it runs correctly "
        "but slowly (engine.dtype=auto picks fp32 here)"
    )
    log.warning("engine.dtype=%s: %s", name, note)
    return name, note


def engine_settings(node: DictConfig) -> EngineSettings:
    asked = str(node.get("device", "auto"))
    device = resolve_device(asked)
    dtype_name, dtype_reason = choose_dtype(str(node.get("dtype", "auto")), device)
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
        dtype_reason=dtype_reason,
        kv_budget_bytes=budget_bytes,
        kv_budget_fraction=fraction,
        max_batch_size=checked(node, "engine.max_batch_size"),
        max_num_batched_tokens=checked(node, "engine.max_num_batched_tokens"),
        attention=checked(node, "engine.attention"),
        fused_decode=checked(node, "engine.fused_decode") == "auto",
        cuda_graphs=checked(node, "engine.cuda_graphs") == "auto",
        seed=checked(node, "engine.seed", 0),
        warmup=checked(node, "engine.warmup", True),
        device_fallback=cpu_fallback_note() if asked == "auto" and device.type == "cpu" else None,
    )
