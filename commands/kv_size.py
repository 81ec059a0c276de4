"""`servelab kv-size`: what the KV cache costs per token and per request, by head layout.

The arithmetic is 2 (keys and values) x layers x stored KV heads x head_dim x bytes per
element. Next to it stands what the engine's own allocator hands out for the same number of
tokens (`allocate_kv_cache` on the chosen device), so the formula is checked against real
tensors, not restated. Shapes too big for the device are reported from the arithmetic only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from omegaconf import DictConfig
from rich.console import Console
from rich.table import Table

from servelab.commands.config import take_counts
from servelab.engine.kv_cache import KVLayout, allocate_kv_cache
from servelab.harness.run.compose import compose
from servelab.models.model import ModelConfig
from servelab.strategies.heads import HEADS

ALLOCATION_LIMIT_BYTES = 4 * 2**30


@dataclass(frozen=True)
class KVSize:
    layout: str
    stored_heads: int
    bytes_per_token: int
    bytes_per_request: int
    bytes_total: int
    allocated_bytes: int | None  # measured from real tensors, when they fit


def kv_sizes(
    config: ModelConfig,
    layouts: list[str],
    context: int,
    batch: int,
    dtype: torch.dtype,
    device: torch.device,
) -> list[KVSize]:
    sizes = []
    for name in layouts:
        stored = HEADS.choose({"heads": name}).build().stored_kv_heads(config)
        kv = KVLayout(config.num_layers, stored, config.head_dim, dtype)
        total = kv.bytes_per_token * context * batch
        allocated = None
        if total <= ALLOCATION_LIMIT_BYTES:
            cache = allocate_kv_cache(kv, total, 1, device)
            allocated = cache.nbytes
            del cache
        sizes.append(
            KVSize(name, stored, kv.bytes_per_token, kv.bytes_per_token * context, total, allocated)
        )
    return sizes


def _human(count: float) -> str:
    """Binary units with the decimal figure beside them (guides quote either)."""
    units = (("GiB", "GB", 30, 9), ("MiB", "MB", 20, 6), ("KiB", "KB", 10, 3))
    for binary, decimal, power2, power10 in units:
        if count >= 2**power2:
            return f"{count / 2**power2:.2f} {binary} ({count / 10**power10:.2f} {decimal})"
    return f"{count:.0f} B"


def render_kv_sizes(title: str, sizes: list[KVSize], context: int, batch: int) -> str:
    table = Table(title=f"{title}: KV cache at {context} tokens x {batch} requests")
    for column in ("heads", "stored KV heads", "per token", "per request", "total", "allocated"):
        table.add_column(column, justify="right")
    for size in sizes:
        allocated = (
            "too big to allocate here"
            if size.allocated_bytes is None
            else (
                "= total"
                if size.allocated_bytes == size.bytes_total
                else _human(size.allocated_bytes)
            )
        )
        table.add_row(
            size.layout,
            str(size.stored_heads),
            _human(size.bytes_per_token),
            _human(size.bytes_per_request),
            _human(size.bytes_total),
            allocated,
        )
    console = Console(record=True, width=120)
    with console.capture() as capture:
        console.print(table)
    return capture.get()


SUMMARY = "what the KV cache costs per token and per request, by head layout"
USAGE = """usage: servelab kv-size [context=N] [batch=N] [model=NAME] [engine.dtype=...]

The arithmetic (2 x layers x stored KV heads x head_dim x bytes) for mha, gqa, mqa and the
configured strategy.heads, beside what the engine's allocator really hands out."""


def main(args: list[str]) -> None:
    numbers, rest = take_counts(args, {"context": 4096, "batch": 1})
    print(kv_size_main(compose(rest), numbers["context"], numbers["batch"]))


def kv_size_main(cfg: DictConfig, context: int, batch: int) -> str:
    from servelab.harness.run.settings import engine_settings, model_of
    from servelab.models.load import model_config_of

    settings = engine_settings(cfg.engine)
    config = model_config_of(model_of(cfg))
    requested = str(cfg.strategy.heads)
    layouts = ["mha", "gqa", "mqa"] + (
        [requested] if requested not in ("mha", "gqa", "mqa") else []
    )
    sizes = kv_sizes(config, layouts, context, batch, settings.dtype, settings.device)
    return render_kv_sizes(str(cfg.model.name), sizes, context, batch)
