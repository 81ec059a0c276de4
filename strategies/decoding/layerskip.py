"""Self-drafting by early exit (`strategy.proposer=layerskip`): the target's first k layers,
then its own final norm and LM head.

The view shares every tensor with the target (no second checkpoint, no copy) and runs the
target's own forward over the first `k` layers only. It keeps its own KV cache for those k
layers; what it stores for verified tokens equals the target's first k layers' keys and
values, so it costs about k/L of the target's KV per token. A checkpoint not trained for
early exit drafts poorly from shallow layers; the acceptance rate shows how poorly.
"""

from __future__ import annotations

import copy
from dataclasses import replace

from torch import nn

from servelab.models.model import LlamaModel


def early_exit(model: LlamaModel, num_layers: int) -> LlamaModel:
    """A model that runs `model`'s first `num_layers` layers (1 to fewer than all, as the
    proposer's check guarantees), its final norm and its head."""
    view = copy.copy(model)  # a new module object whose attributes are the target's
    view._modules = dict(model._modules)  # its own table of children, the same children
    view._modules["layers"] = nn.ModuleList(list(model.layers)[:num_layers])
    view.config = replace(model.config, num_layers=num_layers)
    return view
