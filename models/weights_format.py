"""The interface of the weights axis: how the linear layers' weights are stored and multiplied.

A weights format turns the dense checkpoint (after any head-layout conversion) into what it
serves, for example quantised and packed tensors, made once and cached; it supplies the
layer the model builds for each linear (the linear factory); and it says how many bytes of
weights one forward reads, which the roofline divides by. A format that calibrates on text
(AWQ) gets it through the context, tokenised only when nothing is cached.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from servelab.models.load import Checkpoint
from servelab.models.model import LlamaModel, plain_linear


@dataclass(frozen=True)
class CalibrationText:
    """Real text to calibrate on: its name and digest (for caches and records) and its token
    ids, computed on demand."""

    name: str
    digest: str
    token_ids: Callable[[], list[int]]


@dataclass(frozen=True)
class WeightsContext:
    """What preparing weights may need besides the checkpoint."""

    dtype: torch.dtype  # the engine dtype activations run in
    device: torch.device
    cache_dir: Path  # where prepared weights are kept between runs
    checkpoint_id: str  # names the dense checkpoint (file hash and head layout)
    progress: bool = True
    calibration: CalibrationText | None = None


class WeightsFormat:
    """What the loader and the roofline need from a weights format."""

    def prepare(self, checkpoint: Checkpoint, context: WeightsContext) -> Checkpoint:
        """The checkpoint this format serves, from the dense one (as is by default)."""
        del context
        return checkpoint

    def settings_id(self) -> str:
        """Names what this format serves from a checkpoint, in cache folders and records."""
        return "dense"

    def record(self) -> dict[str, Any] | None:
        """How the served weights were made (a quantiser's record), once prepared."""
        return None

    def linear(self, in_features: int, out_features: int, name: str) -> nn.Module:
        """The layer the model builds for the linear `name` (a plain one by default)."""
        return plain_linear(in_features, out_features, name)

    def weight_bytes(self, model: LlamaModel) -> int:
        """Bytes one forward reads of the weights: every stored tensor once, except an
        untied input embedding table (only a few of its rows are gathered)."""
        seen: set[int] = set()
        total = 0
        skip = set() if model.config.tie_embeddings else {"embed_tokens.weight"}
        for name, tensor in model.state_dict().items():
            if name in skip or tensor.data_ptr() in seen:
                continue
            seen.add(tensor.data_ptr())
            total += tensor.numel() * tensor.element_size()
        return total
