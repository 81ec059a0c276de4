"""A published-style AWQ checkpoint folder, written from the format's description alone.

Nothing here imports servelab: the int4 values, zero points and scales are made with numpy,
packed word by word in AutoAWQ's nibble order (nibble i of each int32 holds output channel
ORDER[i] of its eight), and written under Hugging Face names with a `quantization_config`,
as AutoAWQ writes Llama checkpoints. The loader is tested against this file.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
PROJECTIONS = {
    "q_proj": "self_attn",
    "k_proj": "self_attn",
    "v_proj": "self_attn",
    "o_proj": "self_attn",
    "gate_proj": "mlp",
    "up_proj": "mlp",
    "down_proj": "mlp",
}


def pack_rows(values: np.ndarray) -> np.ndarray:
    """`[rows, cols]` ints in 0..15 -> int32 `[rows, cols // 8]`, one word at a time."""
    rows, cols = values.shape
    out = np.zeros((rows, cols // 8), dtype=np.int64)
    for r in range(rows):
        for w in range(cols // 8):
            word = 0
            for nibble, channel in enumerate(ORDER):
                word |= int(values[r, w * 8 + channel]) << (4 * nibble)
            out[r, w] = word - (1 << 32) if word >= 1 << 31 else word
    return out.astype(np.int32)


def quantize_linear(weight: np.ndarray, group: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """AWQ tensors for `weight` `[out, in]` (in a multiple of `group`) and the weight they
    stand for, `[out, in]`."""
    out_features, in_features = weight.shape
    groups = weight.reshape(out_features, in_features // group, group)
    low, high = groups.min(-1), groups.max(-1)
    scales = ((high - low) / 15).astype(np.float16)
    step = scales.astype(np.float32)
    zeros = np.clip(np.round(-low / step), 0, 15)
    values = np.clip(np.round(groups / step[..., None]) + zeros[..., None], 0, 15)
    served = ((values - zeros[..., None]) * step[..., None]).reshape(out_features, in_features)
    tensors = {
        "qweight": pack_rows(values.reshape(out_features, in_features).T.astype(np.int64)),
        "qzeros": pack_rows(zeros.T.astype(np.int64)),
        "scales": np.ascontiguousarray(scales.T),
    }
    return tensors, served


def write_awq_folder(
    folder: Path, hf_config: dict, dense: dict[str, np.ndarray], group: int
) -> dict[str, np.ndarray]:
    """Write `folder` (config.json + model.safetensors); `dense` holds Hugging Face names with
    float weights. Returns the served weights, by Hugging Face name, for comparisons."""
    folder.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, np.ndarray] = {}
    served: dict[str, np.ndarray] = {}
    for name, weight in dense.items():
        projection = name.split(".")[-2]
        if projection in PROJECTIONS and name.endswith(".weight"):
            packed, served[name] = quantize_linear(weight, group)
            base = name.removesuffix(".weight")
            for key, value in packed.items():
                tensors[f"{base}.{key}"] = value
        else:
            tensors[name] = weight.astype(np.float16)
            served[name] = tensors[name].astype(np.float32)
    save_file(tensors, str(folder / "model.safetensors"))
    config = dict(hf_config)
    config["quantization_config"] = {
        "quant_method": "awq",
        "bits": 4,
        "group_size": group,
        "zero_point": True,
        "version": "gemm",
        "modules_to_not_convert": None,
    }
    (folder / "config.json").write_text(json.dumps(config))
    return served
