"""What the int4 weight formats share: the cache, already-quantised checkpoints, the layers.

`prepare` serves a dense checkpoint's quantised form, made once per checkpoint and settings
(`quantize`, each method's own) and kept as an AWQ checkpoint folder in the cache
(`strategies.weights.int4_checkpoint`), then read back through the Hugging Face reader. A
checkpoint that is already AWQ-quantised (a published one, `model.source=hf`) is served as
it is, after its shapes are checked against the configured group size. A dummy shape has no
weights to quantise: its int4 layers draw random ones as they are built (`vllm-awq` on
`dummy-llama3-8b` measures int4 speed on the GPU, not quality). `linear` builds an
`Int4Linear` for every linear the model asks for (q/k/v/o, gate/up/down); the embedding and
the (tied) LM head stay dense.
"""

from __future__ import annotations

import resource
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from servelab.base.errors import ConfigError
from servelab.kernels.int4_layout import PACK, num_groups
from servelab.kernels.int4_linear import AWQ_TENSORS, Int4Linear
from servelab.kernels.int4_matmul import IMPLS, choose_kernel
from servelab.kernels.linear import packed_linear
from servelab.models.load import Checkpoint, StateDict
from servelab.models.model import ModelConfig
from servelab.models.weights_format import WeightsContext, WeightsFormat
from servelab.strategies.weights.int4_checkpoint import (
    checkpoint_folder,
    is_complete,
    read_checkpoint,
    read_record,
    write_checkpoint,
)
from servelab.strategies.weights.int4_quant import QuantizedWeight

GROUP_SIZES = (32, 64, 128, 256)
LINEARS = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)


@dataclass(frozen=True)
class Int4Config:
    """The keys every int4 option reads."""

    group_size: int = field(
        default=128,
        metadata={"choices": GROUP_SIZES, "help": "int4 weights per scale along the input"},
    )
    int4_kernel: str = field(
        default="auto",
        metadata={"choices": IMPLS, "help": "the int4 matmul (auto: by device and dtype)"},
    )


def linear_shapes(config: ModelConfig) -> dict[str, tuple[int, int]]:
    """(in, out) of each quantised linear of one layer."""
    hidden, inner = config.hidden_size, config.intermediate_size
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    shapes = (
        (hidden, q),
        (hidden, kv),
        (hidden, kv),
        (q, hidden),
        (hidden, inner),
        (hidden, inner),
        (inner, hidden),
    )
    return dict(zip(LINEARS, shapes, strict=True))


def is_quantized(state: StateDict) -> bool:
    return any(name.endswith(".qweight") for name in state)


def replace_linears(state: StateDict, layer: int, quantized: dict[str, QuantizedWeight]) -> None:
    """Put one layer's int4 tensors in place of its dense linear weights in `state`."""
    for name, weight in quantized.items():
        prefix = f"layers.{layer}.{name}"
        state.pop(f"{prefix}.weight", None)
        for tensor_name, tensor in weight.packed().items():
            state[f"{prefix}.{tensor_name}"] = tensor


def peak_memory(device: torch.device) -> dict[str, int | None]:
    """The process's peak resident memory, and on CUDA the peak allocated device memory."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    cuda = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return {"peak_rss_bytes": rss, "peak_cuda_bytes": cuda}


class Int4Weights(WeightsFormat, ABC):
    """Int4 weights, one method of making them per subclass."""

    method = ""  # "rtn" | "awq"
    accepts_quantized = False  # serve an already-quantised checkpoint as it is

    def __init__(self, config: Int4Config) -> None:
        self.config = config
        self.context: WeightsContext | None = None
        self.folder: Path | None = None
        self._record: dict[str, Any] | None = None

    def settings_id(self) -> str:
        return f"int4-{self.method}-g{self.config.group_size}"

    def settings(self) -> dict[str, Any]:
        """The settings that decide the quantised weights (recorded with them)."""
        return {"method": self.method, "group_size": self.config.group_size}

    @abstractmethod
    def quantize(
        self, checkpoint: Checkpoint, context: WeightsContext
    ) -> tuple[StateDict, dict[str, Any]]:
        """The quantised state dict of a dense checkpoint, and what to record about it."""

    def record(self) -> dict[str, Any] | None:
        return self._record

    def prepare(self, checkpoint: Checkpoint, context: WeightsContext) -> Checkpoint:
        config, state = checkpoint
        self.context = context
        if state is None:  # a dummy shape: its int4 layers draw random weights as they are built
            self._record = {**self.settings(), "method": "random: a dummy shape has no weights"}
            return checkpoint
        if is_quantized(state):
            self._check_quantized(config, state)
            self._record = {"method": "loaded as quantised", "group_size": self.config.group_size}
            return checkpoint
        folder = checkpoint_folder(context.cache_dir, context.checkpoint_id, self.settings_id())
        if not is_complete(folder):
            start = time.perf_counter()
            if context.device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(context.device)
            quantized, record = self.quantize(checkpoint, context)
            record = {
                **self.settings(),
                **record,
                "seconds": time.perf_counter() - start,
                **peak_memory(context.device),
                "device": str(context.device),
                "checkpoint_id": context.checkpoint_id,
            }
            write_checkpoint(folder, config, quantized, self.config.group_size, record)
        self.folder = folder
        self._record = read_record(folder) | {"folder": str(folder)}
        return config, read_checkpoint(folder)[1]

    def _check_quantized(self, config: ModelConfig, state: StateDict) -> None:
        if not self.accepts_quantized:
            raise ConfigError(
                "strategy.weights",
                f"the checkpoint is already AWQ-quantised; serve it with strategy.weights="
                f"int4-awq, not int4-{self.method}",
            )
        group = self.config.group_size
        for layer in range(config.num_layers):
            for name, (inputs, outputs) in linear_shapes(config).items():
                prefix = f"layers.{layer}.{name}"
                if any(f"{prefix}.{t}" not in state for t in AWQ_TENSORS):
                    raise ConfigError(
                        "model.path", f"{prefix} is not quantised; int4 needs every linear packed"
                    )
                if tuple(state[f"{prefix}.qweight"].shape) != (inputs, outputs // PACK):
                    raise ConfigError(
                        "strategy.heads",
                        f"{prefix} has shape {tuple(state[f'{prefix}.qweight'].shape)} packed, "
                        f"the model needs ({inputs}, {outputs // PACK}); an int4 checkpoint's "
                        "K/V heads cannot be regrouped (use strategy.heads=gqa or mha)",
                    )
                rows = state[f"{prefix}.scales"].shape[0]
                if rows != num_groups(inputs, group):
                    hint = f"={inputs // rows}" if inputs % rows == 0 else " to match"
                    raise ConfigError(
                        "strategy.group_size",
                        f"{prefix} has {rows} groups over {inputs} inputs, not the "
                        f"{num_groups(inputs, group)} of group_size={group}; set "
                        f"strategy.group_size{hint}",
                    )

    def linear(self, in_features: int, out_features: int, name: str) -> nn.Module:
        if name == "lm_head":  # tied to the embedding table, which stays dense
            return packed_linear(in_features, out_features, name)
        if self.context is None:
            raise RuntimeError("prepare() must run before the model's layers are built")
        kernel = choose_kernel(
            self.config.int4_kernel,
            self.context.device,
            self.context.dtype,
            in_features,
            out_features,
            self.config.group_size,
        )
        return Int4Linear(kernel)


def quantize_layers(
    config: ModelConfig,
    state: StateDict,
    per_layer: Callable[[int], dict[str, QuantizedWeight]],
    progress: Any,
) -> StateDict:
    """A copy of `state` with each layer's linears replaced by `per_layer(layer)`'s output."""
    out = dict(state)
    for layer in progress(range(config.num_layers)):
        replace_linears(out, layer, per_layer(layer))
    return out
