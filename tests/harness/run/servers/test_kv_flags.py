"""The run's KV budget and dtype as each engine's own switches (`server.same_budget`,
`harness/run/servers/kv_flags.py`): as many tokens as servelab's engine fits in
`engine.kv_budget`, in the run's dtype, the switches before `server.flags`."""

from __future__ import annotations

import sys

import pytest
import torch

from servelab.base.errors import ConfigError
from servelab.harness.run.compose import compose
from servelab.harness.run.servers.kv_flags import budget_flags, kv_token_bytes
from servelab.harness.run.spec import run_spec
from servelab.models.dummy import DUMMY_SHAPES

SMOLLM = DUMMY_SHAPES["smollm2-135m"]  # 30 layers, 3 KV heads of 64: 46,080 bytes a token in fp32
MIB_32 = 32 * 2**20


def test_a_token_of_kv_is_keys_and_values_of_every_layer_in_the_dtype() -> None:
    assert kv_token_bytes(SMOLLM, torch.float32) == 2 * 30 * 3 * 64 * 4 == 46_080
    assert kv_token_bytes(SMOLLM, torch.bfloat16) == 23_040


def test_vllm_holds_the_budget_in_whole_blocks_one_of_them_its_null_block() -> None:
    cpu = budget_flags("vllm", SMOLLM, torch.float32, MIB_32, "cpu")  # 728 tokens: 22 blocks
    assert cpu.flags == ("--dtype", "float32", "--block-size", "32", "--kv-cache-memory-bytes",
                         str(22 * 32 * 46_080), "--max-model-len", "672")  # fmt: skip
    assert cpu.kv_tokens == 672 and "22 blocks of 32 tokens" in cpu.notes[0]
    gpu = budget_flags("vllm", SMOLLM, torch.bfloat16, MIB_32, "cuda")  # 1,456 tokens: 91 blocks
    assert gpu.flags[2:4] == ("--block-size", "16") and gpu.kv_tokens == 90 * 16
    with pytest.raises(ConfigError, match="under two of vLLM's 32-token blocks"):
        budget_flags("vllm", SMOLLM, torch.float32, 50 * 46_080, "cpu")
    fraction = budget_flags("vllm", SMOLLM, torch.bfloat16, None, "cuda")
    assert fraction.flags == ("--dtype", "bfloat16") and fraction.kv_tokens is None
    assert "its own way" in fraction.notes[0]


def test_sglang_and_llama_cpp_hold_the_budget_s_tokens() -> None:
    sglang = budget_flags("sglang", SMOLLM, torch.float32, MIB_32, "cpu")
    assert sglang.flags == ("--dtype", "float32", "--max-total-tokens", "728",
                            "--context-length", "728")  # fmt: skip
    llama = budget_flags("llamacpp", SMOLLM, torch.bfloat16, MIB_32, "cpu")
    assert llama.flags == ("-ctk", "bf16", "-ctv", "bf16", "-c", "1456", "--kv-unified")
    assert llama.kv_tokens == 1536 and "padded by llama.cpp to 1536" in llama.notes[0]
    assert budget_flags("command", SMOLLM, torch.float32, MIB_32, "cpu").flags == ()


def test_a_server_gets_the_budget_after_its_preset_and_before_its_own_flags() -> None:
    overrides = ["server=llamacpp", f"server.executable={sys.executable}", "engine.dtype=fp32",
                 "engine.kv_budget=32MiB", "server.strategy=orca",
                 "server.flags=[--threads,2]"]  # fmt: skip
    server = run_spec(compose(overrides)).server
    assert server is not None
    argv = server.argv(1)
    assert argv[-12:] == ["--parallel", "32", "--cont-batching", "-ctk", "f32", "-ctv", "f32",
                          "-c", "728", "--kv-unified", "--threads", "2"]  # fmt: skip
    own = run_spec(compose([*overrides, "server.same_budget=false"])).server
    assert own is not None and "-c" not in own.argv(1)
    with pytest.raises(ConfigError, match="server.same_budget: 'yes' must be true or false"):
        run_spec(compose([*overrides, "server.same_budget=yes"]))
