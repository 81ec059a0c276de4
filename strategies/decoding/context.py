"""What a decoding strategy may need when it is built: the target model and, for a speculative
strategy that drafts with a network, that network and its own KV cache.

`harness.run.build.build_engine` makes one of these for every engine. The drafting network
(the target's first layers, or a separate draft model) gets a KV cache of its own, sized by
the same budget rule as the target's and managed by the same KV strategy (`build_kv`), so it
allocates, shares prefixes and rolls back exactly as the target's cache does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from servelab.base.batch import AttentionFn
from servelab.engine.kv_cache import KVCache
from servelab.engine.kv_manager import KVManager
from servelab.models.model import LlamaModel

if TYPE_CHECKING:
    from servelab.strategies.decoding.proposers import DraftSource


@dataclass(frozen=True)
class DecoderContext:
    target: LlamaModel
    attention: AttentionFn
    device: torch.device
    build_kv: Callable[[KVCache], KVManager]  # the run's KV strategy, for a drafter's own cache
    draft_source: DraftSource | None = None  # the chosen proposer (speculative decoding)
    drafter: LlamaModel | None = None  # the network that drafts, if the strategy uses one
    drafter_cache: KVCache | None = None  # its KV cache (as many slots as the target's)
