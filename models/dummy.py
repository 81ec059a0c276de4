"""Named model shapes served with random weights: memory and throughput studies without files."""

from __future__ import annotations

from servelab.models.model import ModelConfig

DUMMY_SHAPES: dict[str, ModelConfig] = {
    "tiny": ModelConfig(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        max_context=512,
        tie_embeddings=True,
        eos_token_ids=(2,),
    ),
    "smollm2-135m": ModelConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_layers=30,
        num_heads=9,
        num_kv_heads=3,
        head_dim=64,
        rope_theta=100000.0,
        max_context=8192,
        tie_embeddings=True,
        eos_token_ids=(2,),
    ),
    "llama2-7b": ModelConfig(
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=11008,
        num_layers=32,
        num_heads=32,
        num_kv_heads=32,
        head_dim=128,
        max_context=4096,
        eos_token_ids=(2,),
    ),
    "llama2-13b": ModelConfig(
        vocab_size=32000,
        hidden_size=5120,
        intermediate_size=13824,
        num_layers=40,
        num_heads=40,
        num_kv_heads=40,
        head_dim=128,
        max_context=4096,
        eos_token_ids=(2,),
    ),
    "llama3-8b": ModelConfig(
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        rope_theta=500000.0,
        max_context=8192,
        eos_token_ids=(128001, 128009),
    ),
}
