"""`servelab kv-size` reproduces the serving guides' KV arithmetic and the allocator agrees."""

from __future__ import annotations

import torch

from servelab.commands.kv_size import kv_sizes
from servelab.engine.kv_cache import KVLayout
from servelab.models.dummy import DUMMY_SHAPES

CPU = torch.device("cpu")


def test_llama3_8b_per_token_bytes_by_head_layout() -> None:
    sizes = kv_sizes(DUMMY_SHAPES["llama3-8b"], ["mha", "gqa", "mqa"], 2, 1, torch.float16, CPU)
    per_token = {s.layout: s.bytes_per_token for s in sizes}
    assert per_token == {"mha": 512 * 1024, "gqa": 128 * 1024, "mqa": 16 * 1024}
    assert all(s.allocated_bytes == s.bytes_total == 2 * s.bytes_per_token for s in sizes)


def test_llama2_13b_sequence_of_4096_tokens_is_about_3_4_gb() -> None:
    config = DUMMY_SHAPES["llama2-13b"]
    layout = KVLayout(config.num_layers, config.num_kv_heads, config.head_dim, torch.float16)
    assert layout.bytes_per_token * 4096 == 3_355_443_200
