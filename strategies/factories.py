"""The factory contract of each axis: what its options are built from, and what they make.

`Option.build(config, *arguments)` makes an axis's implementation; the arguments after the
config are the axis's, the same for every option on it. They are written here once, as the
type of the axis's options and of the choice a config makes, so that a type checker holds
each option's factory, each registry and each call site (`harness.run.build`) to them.
Adding an axis is one alias pair here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:
    from servelab.engine.decoding import Decoder
    from servelab.engine.kv_cache import KVCache
    from servelab.engine.kv_manager import KVManager
    from servelab.engine.scheduling import AdmissionPolicy, Scheduler, SchedulerLimits
    from servelab.models.head_layout import HeadLayout
    from servelab.models.weights_format import WeightsFormat
    from servelab.strategies.decoding.context import DecoderContext
    from servelab.strategies.decoding.proposers import DraftSource
    from servelab.strategies.registry import Choice, Option

# batching: a scheduler over the run's KV manager, its limits and its admission order
BatchingOption: TypeAlias = "Option[[KVManager, SchedulerLimits, AdmissionPolicy], Scheduler]"
BatchingChoice: TypeAlias = "Choice[[KVManager, SchedulerLimits, AdmissionPolicy], Scheduler]"
# policy: the order in which waiting requests are admitted
PolicyOption: TypeAlias = "Option[[], AdmissionPolicy]"
PolicyChoice: TypeAlias = "Choice[[], AdmissionPolicy]"
# kv: the manager of one allocated cache (the target's, or a drafter's)
KVOption: TypeAlias = "Option[[KVCache], KVManager]"
KVChoice: TypeAlias = "Choice[[KVCache], KVManager]"
# heads: how many KV heads the cache stores per layer
HeadsOption: TypeAlias = "Option[[], HeadLayout]"
HeadsChoice: TypeAlias = "Choice[[], HeadLayout]"
# weights: how the linear layers are stored and multiplied
WeightsOption: TypeAlias = "Option[[], WeightsFormat]"
WeightsChoice: TypeAlias = "Choice[[], WeightsFormat]"
# decoding: what a sequence feeds per step and what is accepted, given the engine's parts
DecodingOption: TypeAlias = "Option[[DecoderContext], Decoder]"
DecodingChoice: TypeAlias = "Choice[[DecoderContext], Decoder]"
# proposer: where speculative decoding's drafts come from
ProposerOption: TypeAlias = "Option[[], DraftSource]"
ProposerChoice: TypeAlias = "Choice[[], DraftSource]"
