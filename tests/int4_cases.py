"""Shared pieces of the int4 weight tests: a tiny checkpoint, contexts, formats, logits."""

from __future__ import annotations

from pathlib import Path

import torch

from servelab.base.batch import ForwardBatch
from servelab.models.dummy import DUMMY_SHAPES
from servelab.models.load import Checkpoint, build_model
from servelab.models.model import LlamaModel
from servelab.models.weights_format import CalibrationText, WeightsContext, WeightsFormat
from servelab.strategies.weights import WEIGHTS
from tests.tiny import dense_attention

CPU = torch.device("cpu")
CONFIG = DUMMY_SHAPES["tiny"]  # hidden 64, inner 128, 4 query heads / 2 KV heads of 16


def tiny_checkpoint(seed: int = 0, salient: int | None = None) -> Checkpoint:
    """Random tiny weights; `salient` makes one hidden channel's activations large in every
    layer (its norm weights multiplied by 20), as trained models' outlier channels are."""
    generator = torch.Generator().manual_seed(seed)
    shapes = LlamaModel(CONFIG).state_dict()
    state = {}
    for name, tensor in shapes.items():
        if name.endswith("norm.weight"):
            state[name] = torch.ones(tensor.shape)
            if salient is not None and not name.startswith("norm"):
                state[name][salient] = 20.0
        else:
            state[name] = torch.randn(tensor.shape, generator=generator) * 0.3
    state.pop("lm_head.weight", None)  # tied to the embedding
    return CONFIG, state


def random_text(count: int = 4096, seed: int = 1) -> CalibrationText:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(17, CONFIG.vocab_size, (count,), generator=generator).tolist()
    return CalibrationText("random tokens", f"{seed:064d}", lambda: ids)


def context(
    cache: Path,
    dtype: torch.dtype = torch.float32,
    calibration: CalibrationText | None = None,
    checkpoint_id: str = "tiny-test",
) -> WeightsContext:
    return WeightsContext(dtype, CPU, cache, checkpoint_id, False, calibration)


def weights_format(name: str, **keys) -> WeightsFormat:
    node = {"weights": name, "int4_kernel": "reference", **keys}
    return WEIGHTS.choose(node).build()


def served_model(checkpoint: Checkpoint, weights: WeightsFormat, ctx: WeightsContext) -> LlamaModel:
    """The model `weights` serves from `checkpoint`, as the loader builds it."""
    return build_model(weights.prepare(checkpoint, ctx), ctx.dtype, CPU, weights.linear)


@torch.inference_mode()
def all_logits(model: LlamaModel, tokens: list[int]) -> torch.Tensor:
    """Next-token logits at every position, cache-free."""
    batch = ForwardBatch.single(torch.tensor(tokens), torch.arange(len(tokens)))
    layers = model.config.num_layers
    return model(batch, [None] * layers, [None] * layers, dense_attention)


def pack_int4_blocked(values: torch.Tensor, block: int) -> torch.Tensor:
    """Int4 values `[N, K]` in torch's blocked CPU packing, built by indexing: uint8
    `[N, K / 2]` holding `[N / block, K, block / 2]` bytes, byte j of row k of block b with
    output b * block + j in its low nibble and b * block + block / 2 + j in its high one."""
    n_len, k_len = values.shape
    half = block // 2
    blocks = values.to(torch.uint8).view(n_len // block, 2, half, k_len).permute(0, 3, 1, 2)
    packed = blocks[:, :, 0] | (blocks[:, :, 1] << 4)  # [N / block, K, half]
    return packed.contiguous().view(n_len, k_len // 2)
