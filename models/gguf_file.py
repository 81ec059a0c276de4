"""Read a llama-architecture GGUF file into our model, dequantising every tensor.

llama.cpp's converter stores the rows of the query and key projections permuted for its
interleaved rotary layout; `unpermute_rotary_rows` undoes that so our rotate-half RoPE
applies, exactly as the original checkpoint would.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from gguf import GGUFReader
from gguf.quants import dequantize

from servelab.base.errors import ConfigError
from servelab.models.model import ModelConfig

_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_norm",
    "ffn_norm": "post_attention_norm",
}


def unpermute_rotary_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Invert llama.cpp's per-head row interleaving of a Q or K projection [out, in]."""
    out_features = weight.shape[0]
    half = out_features // num_heads // 2
    return (
        weight.reshape(num_heads, half, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
    )


def _field(reader: GGUFReader, key: str, default: object = None) -> object:
    field = reader.fields.get(key)
    if field is None:
        if default is None:
            raise ConfigError("model.path", f"GGUF file lacks metadata key {key!r}")
        return default
    return field.contents()


def read_gguf_config(reader: GGUFReader) -> ModelConfig:
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ConfigError("model.path", f"GGUF architecture is {arch!r}; only 'llama' is supported")
    hidden = int(_field(reader, "llama.embedding_length"))
    heads = int(_field(reader, "llama.attention.head_count"))
    names = {t.name for t in reader.tensors}
    vocab = int(_field(reader, "llama.vocab_size", len(_field(reader, "tokenizer.ggml.tokens"))))
    return ModelConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=int(_field(reader, "llama.feed_forward_length")),
        num_layers=int(_field(reader, "llama.block_count")),
        num_heads=heads,
        num_kv_heads=int(_field(reader, "llama.attention.head_count_kv", heads)),
        head_dim=hidden // heads,
        rope_theta=float(_field(reader, "llama.rope.freq_base", 10000.0)),
        rms_norm_eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon", 1e-5)),
        max_context=int(_field(reader, "llama.context_length", 4096)),
        tie_embeddings="output.weight" not in names,
        eos_token_ids=(int(_field(reader, "tokenizer.ggml.eos_token_id", -1)),),
    )


def read_gguf_state_dict(reader: GGUFReader, config: ModelConfig) -> dict[str, torch.Tensor]:
    """Our parameter names mapped to dequantised fp32 tensors."""
    state: dict[str, torch.Tensor] = {}
    for tensor in reader.tensors:
        array = dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        parts = tensor.name.split(".")
        if parts[0] == "blk":
            index, kind = parts[1], parts[2]
            if kind == "attn_q":
                array = unpermute_rotary_rows(array, config.num_heads)
            elif kind == "attn_k":
                array = unpermute_rotary_rows(array, config.num_kv_heads)
            name = f"layers.{index}.{_LAYER_NAMES[kind]}.weight"
        else:
            name = {
                "token_embd.weight": "embed_tokens.weight",
                "output_norm.weight": "norm.weight",
                "output.weight": "lm_head.weight",
            }[tensor.name]
        state[name] = torch.from_numpy(np.ascontiguousarray(array))
    return state


def load_gguf(path: Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    if not path.is_file():
        raise ConfigError("model.path", f"no GGUF file at {path}; check the path")
    try:
        reader = GGUFReader(str(path))
    except (ValueError, OSError) as error:
        raise ConfigError("model.path", f"{path} is not a readable GGUF file ({error})") from error
    config = read_gguf_config(reader)
    return config, read_gguf_state_dict(reader, config)
