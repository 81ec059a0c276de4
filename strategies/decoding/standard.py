"""`standard` decoding: every step feeds each running sequence its last token and samples one."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from servelab.engine.decoding import Decoder, Verification
from servelab.engine.sampler import sample
from servelab.strategies.registry import NoConfig, Option

if TYPE_CHECKING:
    from servelab.strategies.factories import DecodingOption


class StandardDecoder(Decoder):
    def accept(self, logits: torch.Tensor, due: list[Verification]) -> list[list[int]]:
        if any(v.num_drafts for v in due):
            raise RuntimeError("standard decoding proposes no drafts, yet drafts were fed")
        return [[token] for token in sample(logits, [v.request for v in due])]


STANDARD: DecodingOption = Option(
    name="standard",
    summary="one token per sequence per step",
    config=NoConfig,
    build=lambda config, context: StandardDecoder(),
)
