"""transformers' LlamaForCausalLM on exactly the weights servelab's engine serves.

The model `model` names is loaded by servelab's own loader (the embedded GGUF's converted
checkpoint, a GGUF or Hugging Face folder, or a dummy shape's seeded random weights), and its
tensors are handed to transformers' module as they are (no copy): the two sides differ only
in the code that runs them.
"""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from servelab.models.load import LoadedModel

RENAMED = {"input_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm"}


def hf_name(name: str) -> str:
    """transformers' name of one of our parameters."""
    if name == "lm_head.weight":
        return name
    for ours, theirs in RENAMED.items():
        name = name.replace(f".{ours}.", f".{theirs}.")
    return f"model.{name}"


def transformers_model(loaded: LoadedModel, attention: str = "sdpa") -> LlamaForCausalLM:
    config = loaded.config
    hf_config = LlamaConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        rope_theta=config.rope_theta,
        rms_norm_eps=config.rms_norm_eps,
        max_position_embeddings=config.max_context,
        tie_word_embeddings=config.tie_embeddings,
        eos_token_id=list(config.eos_token_ids),
        pad_token_id=min(config.eos_token_ids, default=0),
        attn_implementation=attention,
    )
    state = {hf_name(name): tensor for name, tensor in loaded.model.state_dict().items()}
    if config.tie_embeddings:
        state.pop("lm_head.weight", None)
    with torch.device("meta"):
        model = LlamaForCausalLM(hf_config)
    model.load_state_dict(state, strict=False, assign=True)
    if config.tie_embeddings:
        model.tie_weights()
    with torch.device(loaded.model.embed_tokens.weight.device):  # buffers, not weights
        model.model.rotary_emb = type(model.model.rotary_emb)(hf_config)
    missing = [n for n, p in model.named_parameters() if p.is_meta]
    if missing:
        raise RuntimeError(f"weights missing for transformers' model: {missing[:4]}")
    return model.eval().requires_grad_(False)
