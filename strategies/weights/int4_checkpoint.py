"""Quantised checkpoints in the cache: written as AWQ checkpoint folders, read like published ones.

A quantised checkpoint is a Hugging Face folder (`config.json` with
`quantization_config = {quant_method: awq, bits: 4, group_size, zero_point: true, version:
gemm}`, `model.safetensors` with AutoAWQ's tensors under Hugging Face names) plus
`calibration.json`, the record of how it was made (method, settings, calibration text and
tokens, per-layer choices, time, peak memory). It lives in
`CACHE/quantized/CHECKPOINT_ID-SETTINGS/` and is read back through
`models.hf_folder`, the reader published AWQ checkpoints go through. Folders are
written under a temporary name and renamed when complete, so an interrupted run leaves no
half-written checkpoint behind.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from servelab.models.hf_folder import hf_config_dict, hf_name, load_hf_folder
from servelab.models.load import Checkpoint
from servelab.models.model import ModelConfig

QUANTIZED_DIR = "quantized"
RECORD_FILE = "calibration.json"
WEIGHTS_FILE = "model.safetensors"


def checkpoint_folder(cache_dir: Path, checkpoint_id: str, settings: str) -> Path:
    """Where the checkpoint made from `checkpoint_id` with `settings` is kept."""
    return cache_dir / QUANTIZED_DIR / f"{checkpoint_id}-{settings}"


def is_complete(folder: Path) -> bool:
    return (folder / RECORD_FILE).is_file() and (folder / WEIGHTS_FILE).is_file()


def awq_config(config: ModelConfig, group_size: int) -> dict[str, Any]:
    """`config.json` of an AWQ checkpoint (AutoAWQ's GEMM packing)."""
    return hf_config_dict(config) | {
        "torch_dtype": "float16",
        "quantization_config": {
            "quant_method": "awq",
            "bits": 4,
            "group_size": group_size,
            "zero_point": True,
            "version": "gemm",
        },
    }


def write_checkpoint(
    folder: Path,
    config: ModelConfig,
    state: dict[str, torch.Tensor],
    group_size: int,
    record: dict[str, Any],
) -> None:
    """Write the folder atomically: config, tensors (a tied head is not stored) and record."""
    staging = folder.with_name(f"{folder.name}.partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    tensors = {
        hf_name(name): tensor.detach().to("cpu").contiguous()
        for name, tensor in state.items()
        if not (config.tie_embeddings and name == "lm_head.weight")
    }
    save_file(tensors, str(staging / WEIGHTS_FILE), metadata={"format": "pt"})
    (staging / "config.json").write_text(json.dumps(awq_config(config, group_size), indent=2))
    (staging / RECORD_FILE).write_text(json.dumps(record, indent=2))
    shutil.rmtree(folder, ignore_errors=True)
    staging.rename(folder)


def read_checkpoint(folder: Path) -> Checkpoint:
    """The checkpoint in `folder`, through the Hugging Face reader."""
    return load_hf_folder(folder)


def read_record(folder: Path) -> dict[str, Any]:
    return json.loads((folder / RECORD_FILE).read_text())
