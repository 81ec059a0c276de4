"""Read (and write) a Hugging Face Llama checkpoint folder (config.json + *.safetensors).

Dense checkpoints load as float32. AWQ checkpoints (`quantization_config.quant_method ==
"awq"`, 4-bit, zero point, AutoAWQ's GEMM packing) keep each quantised linear as its
`qweight`, `qzeros` and `scales` tensors, under the same names as ours
(`layers.N.self_attn.q_proj.qweight`), for the int4 weight formats to load: published AWQ
checkpoints and the ones servelab writes go through this one reader.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from servelab.base.errors import ConfigError
from servelab.models.model import ModelConfig

AWQ_VERSIONS = ("gemm",)
# our parameter names <-> Hugging Face Llama names, for the parts that differ
_NORM_NAMES = (
    ("input_norm", "input_layernorm"),
    ("post_attention_norm", "post_attention_layernorm"),
)


def read_hf_config(folder: Path) -> ModelConfig:
    raw = _raw_config(folder)
    check_quantization(raw)
    try:
        return _model_config(raw)
    except KeyError as missing:
        raise ConfigError(
            "model.path",
            f"{folder / 'config.json'} lacks {missing.args[0]!r}; is it a Llama checkpoint?",
        ) from None
    except (TypeError, ValueError, ZeroDivisionError) as bad:
        raise ConfigError(
            "model.path", f"{folder / 'config.json'} has a malformed value ({bad})"
        ) from None


def _model_config(raw: dict[str, Any]) -> ModelConfig:
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


def _raw_config(folder: Path) -> dict[str, Any]:
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise ConfigError(
            "model.path", f"{folder} has no config.json; point at a checkpoint folder"
        )
    try:
        raw = json.loads(config_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ConfigError("model.path", f"{config_file} is not JSON ({error})") from None
    if not isinstance(raw, dict):
        raise ConfigError("model.path", f"{config_file} is not a JSON object")
    return raw


def check_quantization(raw: dict[str, Any]) -> None:
    """Refuse, in one line, a quantised checkpoint this reader cannot load (AWQ GEMM loads)."""
    quant = raw.get("quantization_config")
    if not quant:
        return
    method = quant.get("quant_method")
    bits = int(quant.get("bits", quant.get("w_bit", 4)))
    version = str(quant.get("version", "gemm")).lower()
    if method != "awq" or bits != 4 or not quant.get("zero_point", True):
        raise ConfigError(
            "model.path",
            f"quantization {method!r} ({bits}-bit) is not supported; only 4-bit AWQ with zero "
            "points loads (strategy.weights=int4-awq)",
        )
    if version not in AWQ_VERSIONS:
        raise ConfigError(
            "model.path", f"AWQ packing {version!r} is not supported; only GEMM checkpoints load"
        )


def _our_name(hf_name: str) -> str | None:
    name = hf_name.removeprefix("model.")
    if name.startswith("layers."):
        for ours, theirs in _NORM_NAMES:
            name = name.replace(theirs, ours)
        return name
    if name in ("embed_tokens.weight", "norm.weight", "lm_head.weight"):
        return name
    return None


def hf_name(name: str) -> str:
    """The Hugging Face name of one of our parameters (the inverse of reading)."""
    if name == "lm_head.weight":
        return name
    for ours, theirs in _NORM_NAMES:
        name = name.replace(f".{ours}.", f".{theirs}.")
    return f"model.{name}"


def hf_config_dict(config: ModelConfig) -> dict[str, Any]:
    """A Hugging Face Llama `config.json` for `config` (what `read_hf_config` reads back)."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "rope_theta": config.rope_theta,
        "rms_norm_eps": config.rms_norm_eps,
        "max_position_embeddings": config.max_context,
        "tie_word_embeddings": config.tie_embeddings,
        "eos_token_id": list(config.eos_token_ids),
    }


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
                state[name] = tensor.float() if tensor.is_floating_point() else tensor
    return config, state
