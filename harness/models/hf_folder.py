"""Read a Hugging Face Llama checkpoint folder (config.json + *.safetensors)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from harness.errors import ConfigError
from harness.models.model import ModelConfig


def read_hf_config(folder: Path) -> ModelConfig:
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise ConfigError(
            "model.path", f"{folder} has no config.json; point at a checkpoint folder"
        )
    raw = json.loads(config_file.read_text())
    heads = int(raw["num_attention_heads"])
    eos = raw.get("eos_token_id", ())
    rope = raw.get("rope_parameters") or {}
    return ModelConfig(
        vocab_size=int(raw["vocab_size"]),
        hidden_size=int(raw["hidden_size"]),
        intermediate_size=int(raw["intermediate_size"]),
        num_layers=int(raw["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(raw.get("num_key_value_heads", heads)),
        head_dim=int(raw.get("head_dim") or raw["hidden_size"] // heads),
        rope_theta=float(raw.get("rope_theta", rope.get("rope_theta", 10000.0))),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-5)),
        max_context=int(raw.get("max_position_embeddings", 4096)),
        tie_embeddings=bool(raw.get("tie_word_embeddings", False)),
        eos_token_ids=tuple(eos) if isinstance(eos, list) else (int(eos),),
    )


def _our_name(hf_name: str) -> str | None:
    name = hf_name.removeprefix("model.")
    if name.startswith("layers."):
        name = name.replace("input_layernorm", "input_norm")
        return name.replace("post_attention_layernorm", "post_attention_norm")
    if name in ("embed_tokens.weight", "norm.weight", "lm_head.weight"):
        return name
    return None


def load_hf_folder(folder: Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    if not folder.is_dir():
        raise ConfigError("model.path", f"no checkpoint folder at {folder}; check the path")
    config = read_hf_config(folder)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ConfigError("model.path", f"{folder} has no *.safetensors files")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        for hf_name, tensor in load_file(str(file)).items():
            name = _our_name(hf_name)
            if name is not None:
                state[name] = tensor.float()
    return config, state
