"""The run's KV budget and dtype as another engine's own switches (`server.same_budget`), so
that engines compared under one SLO hold the same KV: as many tokens as servelab's engine
fits in `engine.kv_budget`, in the run's dtype.

The budget is counted in tokens of the checkpoint's own KV heads (`2 x layers x kv heads x
head dim` elements a token, in the run's dtype), which every engine here serves: vLLM takes
its bytes (`--kv-cache-memory-bytes`, honoured on its CPU build too) in whole blocks of a size
set here (`--block-size`: 32 tokens on a CPU, the fewest its attention takes there; 16 on a
GPU, the presets' own), `--dtype`, and the longest request those blocks hold but its null
block (`--max-model-len`: it refuses to start where one request of the model's full context
would not fit); SGLang its tokens (`--max-total-tokens`, `--context-length`) and `--dtype`;
llama.cpp its tokens as one pool shared by
every slot (`-c` with `--kv-unified`; without it each of `--parallel` slots holds its own
share; it pads the context up to a multiple of 256 tokens) in the run's dtype (`-ctk`, `-ctv`;
its weights stay the GGUF file's). A budget given
as a fraction of free GPU memory has no size to pass: each engine then sizes its own, said in
a note the run records. `server.flags` come after these, so a switch there wins.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from servelab.base.errors import ConfigError
from servelab.engine.kv_cache import KVLayout
from servelab.models.model import ModelConfig

VLLM_CPU_BLOCK = 32  # tokens: the smallest block vLLM's CPU attention takes
VLLM_GPU_BLOCK = 16  # the presets' own
LLAMA_CPP_PAD = 256  # llama.cpp rounds its context up to a multiple of this
TORCH_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
GGML_NAMES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}


@dataclass(frozen=True)
class Budget:
    """The run's KV budget and dtype for one engine: its switches, what they hold, and notes."""

    flags: tuple[str, ...]
    kv_tokens: int | None  # None: the engine sizes its own
    notes: tuple[str, ...]


def kv_token_bytes(config: ModelConfig, dtype: torch.dtype) -> int:
    """Keys and values of one token, every layer, the checkpoint's KV heads, in `dtype`."""
    return KVLayout(config.num_layers, config.num_kv_heads, config.head_dim, dtype).bytes_per_token


def budget_flags(
    engine: str, config: ModelConfig, dtype: torch.dtype, kv_bytes: int | None, device: str
) -> Budget:
    """`engine`'s switches for a KV of `kv_bytes` (None: a fraction of GPU memory) in `dtype`,
    serving on `device` ("cpu" or "cuda")."""
    per_token = kv_token_bytes(config, dtype)
    tokens = None if kv_bytes is None else kv_bytes // per_token
    name = TORCH_NAMES[dtype]
    if tokens is None:
        own = "KV sized its own way (engine.kv_budget is a fraction of free memory)"
    if engine == "vllm":
        flags = ["--dtype", name]
        if tokens is None:
            return Budget(tuple(flags), None, (own,))
        block = VLLM_CPU_BLOCK if device == "cpu" else VLLM_GPU_BLOCK
        blocks = tokens // block
        usable = (blocks - 1) * block  # one block is its null block, never a request's
        if usable < 1:
            raise ConfigError(
                "engine.kv_budget",
                f"{kv_bytes} bytes hold {tokens} tokens: under two of vLLM's {block}-token blocks",
            )
        flags += ["--block-size", str(block), "--kv-cache-memory-bytes",
                  str(blocks * block * per_token), "--max-model-len",
                  str(min(usable, config.max_context))]  # fmt: skip
        return Budget(tuple(flags), usable, (
            f"KV of {blocks} blocks of {block} tokens in {name} ({blocks * block * per_token} "
            f"bytes of engine.kv_budget's {tokens} tokens), one its null block: {usable} tokens "
            "for requests, the longest request's limit too",
        ))  # fmt: skip
    if engine == "sglang":
        flags = ["--dtype", name]
        if tokens is None:
            return Budget(tuple(flags), None, (own,))
        flags += ["--max-total-tokens", str(tokens),
                  "--context-length", str(min(tokens, config.max_context))]  # fmt: skip
        return Budget(tuple(flags), tokens, (f"KV of {tokens} tokens in {name}, as "
                                             "engine.kv_budget holds",))  # fmt: skip
    if engine == "llamacpp":
        flags = ["-ctk", GGML_NAMES[dtype], "-ctv", GGML_NAMES[dtype]]
        if tokens is None:
            return Budget(tuple(flags), None, (own,))
        flags += ["-c", str(tokens), "--kv-unified"]
        padded = -(-tokens // LLAMA_CPP_PAD) * LLAMA_CPP_PAD
        return Budget(tuple(flags), padded, (
            f"KV of {tokens} tokens in {name}, as engine.kv_budget holds, padded by llama.cpp to "
            f"{padded}, one pool for every slot; its weights as the GGUF file holds them",
        ))  # fmt: skip
    return Budget((), None, ())
