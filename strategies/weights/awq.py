"""`int4-awq`: activation-aware weight quantisation (Lin et al., MLSys 2024), AutoAWQ's packing.

The dense model (float32, on the engine's device) runs over `calibration_samples` windows of
`calibration_seq_len` tokens of the calibration text, one decoder layer at a time
(`strategies.weights.calibration`); each layer's scales and clipping are searched on its
captured input statistics, folded in, and its linears quantised
(`strategies.weights.awq_search`) before the next layer runs. The checkpoint and its
calibration record (settings, tokens, per-layer choices, time, peak memory) are cached.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from statistics import mean
from typing import TYPE_CHECKING, Any

import torch
from tqdm import tqdm

from servelab.base.errors import ConfigError
from servelab.models.load import Checkpoint, StateDict, build_model
from servelab.models.weights_format import WeightsContext
from servelab.strategies.registry import Option
from servelab.strategies.weights.awq_search import awq_layer
from servelab.strategies.weights.calibration import LayerRunner, calibration_windows
from servelab.strategies.weights.int4_format import Int4Config, Int4Weights, replace_linears

if TYPE_CHECKING:
    from servelab.strategies.factories import WeightsOption

VERSION = 1  # bump when the search changes, so cached checkpoints are remade


@dataclass(frozen=True)
class AwqConfig(Int4Config):
    """The int4 keys plus calibration and search settings."""

    calibration_samples: int = field(
        default=32, metadata={"minimum": 1, "help": "AWQ calibration windows of real text"}
    )
    calibration_seq_len: int = field(
        default=512, metadata={"minimum": 16, "help": "tokens per AWQ calibration window"}
    )
    awq_grid: int = field(
        default=20, metadata={"minimum": 1, "help": "AWQ scale exponents tried: i / grid"}
    )
    awq_clip: bool = field(default=True, metadata={"help": "AWQ clipping search after scaling"})


class AwqWeights(Int4Weights):
    method = "awq"
    accepts_quantized = True
    config: AwqConfig

    def settings_id(self) -> str:
        config = self.config
        calibration = None if self.context is None else self.context.calibration
        text = "" if calibration is None else f"-text{calibration.digest[:8]}"
        return (
            f"{super().settings_id()}-{config.calibration_samples}x{config.calibration_seq_len}"
            f"-grid{config.awq_grid}-clip{int(config.awq_clip)}{text}-v{VERSION}"
        )

    def settings(self) -> dict[str, Any]:
        config = self.config
        return super().settings() | {
            "calibration_samples": config.calibration_samples,
            "calibration_seq_len": config.calibration_seq_len,
            "grid": config.awq_grid,
            "clip": config.awq_clip,
            "version": VERSION,
        }

    def quantize(
        self, checkpoint: Checkpoint, context: WeightsContext
    ) -> tuple[StateDict, dict[str, Any]]:
        config, state = checkpoint
        assert state is not None
        text = context.calibration
        if text is None:
            raise ConfigError("strategy.weights", "int4-awq needs calibration text; none given")
        settings = self.config
        token_ids = text.token_ids()
        windows = calibration_windows(
            token_ids, settings.calibration_samples, settings.calibration_seq_len
        )
        model = build_model(checkpoint, torch.float32, context.device)
        runner = LayerRunner(model, windows)
        out = dict(state)
        layers: list[dict[str, Any]] = []
        bar = tqdm(
            range(config.num_layers),
            desc="int4-awq: calibrating layers",
            disable=not context.progress,
        )
        for index in bar:
            layer = model.layers[index]
            stats = runner.capture(layer)
            quantized, choices = awq_layer(
                layer, stats, settings.group_size, settings.awq_grid, settings.awq_clip
            )
            replace_linears(out, index, quantized)
            for norm in ("input_norm", "post_attention_norm"):
                out[f"layers.{index}.{norm}.weight"] = layer.get_submodule(norm).weight.cpu()
            layers.append({name: asdict(choice) for name, choice in choices.items()})
            model.layers[index] = torch.nn.Identity()  # its dense weights are done with
        record = {
            "calibration": {
                "text": text.name,
                "text_sha256": text.digest,
                "text_tokens": len(token_ids),
                "samples": settings.calibration_samples,
                "seq_len": settings.calibration_seq_len,
                "tokens": int(windows.numel()),
            },
            "loss_vs_rtn": {name: _mean_ratio(layers, name) for name in layers[0]},
            "layers": layers,
        }
        return out, record


def _mean_ratio(layers: list[dict[str, Any]], group: str) -> float | None:
    """Mean over layers of the kept scales' output error over round-to-nearest's."""
    ratios = [
        layer[group]["loss"] / layer[group]["rtn_loss"]
        for layer in layers
        if layer[group]["rtn_loss"] > 0
    ]
    return mean(ratios) if ratios else None


INT4_AWQ: WeightsOption = Option(
    name="int4-awq",
    summary="int4 weights, activation-aware scales and clipping (AWQ; AutoAWQ packing)",
    config=AwqConfig,
    build=AwqWeights,
)
