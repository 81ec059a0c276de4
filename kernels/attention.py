"""The one attention entry point the model calls per layer: store the new K/V, then attend.

`Attention` writes the step's new keys and values into one layer's cache at the batch's slot
mapping, then computes causal attention of every new token over its sequence's context read
back from the cache, contiguous (slabs) or paged (block tables), for any group size. It picks
the implementation once: the Triton kernels on CUDA; on a CPU the compiled operator and
torch's flash kernel (`kernels.cpu_attention`), or the PyTorch reference path where the
operator cannot be built; or what `AttentionConfig.impl` forces (tests compare them).

Host-side preparation (plans, device copies of lengths, launch sizes) happens once per
batch, on its first layer, and is reused by the other layers while the batch object and the
cache geometry stay the same; a batch must not be mutated after use.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from servelab.base.batch import ForwardBatch
from servelab.base.errors import ConfigError
from servelab.kernels import paged_attention_triton as tri
from servelab.kernels.attention_plan import AttentionPlan
from servelab.kernels.cpu_attention import CpuPlan, plan_cpu, run_cpu
from servelab.kernels.cpu_build import active_build_status
from servelab.kernels.paged_attention_ref import plan_for, run_plan

IMPLS = ("auto", "torch", "triton", "cpu")


@dataclass(frozen=True)
class AttentionConfig:
    """`impl`: "auto" (triton on CUDA, the compiled CPU path elsewhere when it builds, else
    torch), "torch" (the reference), "cpu" or "triton"."""

    impl: str = "auto"


@dataclass(frozen=True)
class _TritonPlan:
    """Device-side lengths and launch sizes of one batch for the Triton kernels."""

    paged: bool
    kv_index: torch.Tensor  # device block tables (int32) or slab starts (int64)
    seq_lens: torch.Tensor  # [B] int32, device
    query_start_loc: torch.Tensor  # [B + 1] int32, device
    max_query_len: int
    decode: tri.DecodeLaunch | None  # set when every sequence has exactly one new token


class Attention:
    """Per-layer attention over the KV cache; one instance serves every layer of a model."""

    def __init__(self, config: AttentionConfig, device: torch.device) -> None:
        if config.impl not in IMPLS:
            raise ConfigError("attention.impl", f"unknown {config.impl!r}; use one of {IMPLS}")
        impl = config.impl
        if impl == "auto":
            impl = "triton" if device.type == "cuda" else _cpu_or_torch()
        if impl == "triton":
            tri.check_triton_usable(device, torch.float32)
        if impl == "cpu":
            _check_cpu_usable(device)
        self._impl = impl
        self._batch: ForwardBatch | None = None
        self._key: tuple[object, ...] | None = None
        self._plan: AttentionPlan | _TritonPlan | CpuPlan | None = None

    @property
    def impl(self) -> str:
        """The resolved implementation: "torch", "cpu" or "triton"."""
        return self._impl

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        batch: ForwardBatch,
        scale: float,
    ) -> torch.Tensor:
        """`q` `[T, Hq, D]`, `k`/`v` `[T, Hkv, D]` new tokens; caches `[blocks, bs, Hkv, D]`."""
        plan = self._plan_for(q, k_cache, batch)
        write_kv(k, v, k_cache, v_cache, batch.slot_mapping)
        if isinstance(plan, CpuPlan):
            return run_cpu(plan, q, k, v, k_cache, v_cache, scale)
        return _attend(plan, q, k_cache, v_cache, scale)

    def attend(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        batch: ForwardBatch,
        scale: float,
    ) -> torch.Tensor:
        """Attention over caches that already hold the new tokens' keys and values (written by
        the caller: the fused path writes them with the rotary embedding); not the CPU
        operator, which reads the new keys and values beside the cache."""
        plan = self._plan_for(q, k_cache, batch)
        if isinstance(plan, CpuPlan):
            raise ConfigError("attention.impl", "the CPU operator attends with the new tokens")
        return _attend(plan, q, k_cache, v_cache, scale)

    def _plan_for(
        self, q: torch.Tensor, k_cache: torch.Tensor, batch: ForwardBatch
    ) -> AttentionPlan | _TritonPlan | CpuPlan:
        key = (k_cache.shape[1:], q.shape[1:], q.dtype, q.device)
        if batch is self._batch and key == self._key and self._plan is not None:
            return self._plan
        _check_batch(q, k_cache, batch)
        if self._impl == "triton":
            tri.check_triton_usable(q.device, q.dtype)
            plan: AttentionPlan | _TritonPlan | CpuPlan = _triton_plan(q, k_cache, batch)
        elif self._impl == "cpu":
            plan = plan_cpu(batch, k_cache.shape[1])
        else:
            plan = plan_for(
                q,
                k_cache,
                batch.seq_lens,
                batch.query_start_loc,
                batch.block_tables,
                batch.slab_starts,
            )
        self._batch, self._key, self._plan = batch, key, plan
        return plan


def _attend(
    plan: AttentionPlan | _TritonPlan,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Attention by a batch's plan over caches holding every key and value it reads."""
    if isinstance(plan, AttentionPlan):
        return run_plan(plan, q, k_cache, v_cache, scale)
    if plan.decode is not None:
        return tri.decode_with_launch(
            q, k_cache, v_cache, plan.kv_index, plan.paged, plan.seq_lens, scale, plan.decode
        )
    return tri.extend_on_device(
        q,
        k_cache,
        v_cache,
        plan.kv_index,
        plan.paged,
        plan.seq_lens,
        plan.query_start_loc,
        scale,
        plan.max_query_len,
    )


def _cpu_or_torch() -> str:
    """The compiled CPU path where it builds, else the PyTorch reference."""
    return "cpu" if active_build_status() is None else "torch"


def _check_cpu_usable(device: torch.device) -> None:
    if device.type != "cpu":
        raise ConfigError("engine.attention", f"cpu attention runs on the CPU, not {device}")
    reason = active_build_status()
    if reason is not None:
        raise ConfigError(
            "engine.attention",
            f"the CPU attention operator could not be built ({reason}); use engine.attention=torch",
        )


def write_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store the new tokens' keys and values at their flat slots `[T]` of one layer's cache."""
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slot_mapping, v.to(v_cache.dtype))


def _triton_plan(q: torch.Tensor, k_cache: torch.Tensor, batch: ForwardBatch) -> _TritonPlan:
    paged = batch.block_tables is not None
    device = q.device
    kv_index = batch.block_tables if paged else batch.slab_starts
    decode = None
    if batch.is_decode_only:
        decode = tri.decode_launch(
            batch.num_seqs, k_cache.shape[2], int(batch.seq_lens.max()), q.shape[2], device
        )
    seq_lens, query_start_loc = batch.device_lens or (batch.seq_lens, batch.query_start_loc)
    return _TritonPlan(
        paged=paged,
        kv_index=_on(kv_index, device, torch.int32 if paged else torch.int64),
        seq_lens=_on(seq_lens, device, torch.int32),
        query_start_loc=_on(query_start_loc, device, torch.int32),
        max_query_len=max(batch.query_lens),
        decode=decode,
    )


def _on(t: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """`t` as the kernels read it: where the batch's one copy already put it, as it is."""
    return t if t.device == device and t.dtype == dtype else t.to(device, dtype)


def _check_batch(q: torch.Tensor, k_cache: torch.Tensor, batch: ForwardBatch) -> None:
    """One-line errors for a batch that cannot describe this layer's inputs."""
    if (batch.block_tables is None) == (batch.slab_starts is None):
        raise ConfigError(
            "batch", "set exactly one of block_tables (paged KV) and slab_starts (contiguous KV)"
        )
    if q.shape[0] != batch.num_tokens or batch.slot_mapping.shape[0] != batch.num_tokens:
        raise ConfigError(
            "batch.slot_mapping",
            f"q has {q.shape[0]} rows, slot_mapping {batch.slot_mapping.shape[0]}, batch "
            f"{batch.num_tokens} tokens; they must all agree",
        )
    if batch.block_tables is not None and batch.block_size != k_cache.shape[1]:
        raise ConfigError(
            "batch.block_size",
            f"{batch.block_size} differs from the cache's block size {k_cache.shape[1]}",
        )
    if q.shape[1] % k_cache.shape[2] or q.shape[2] != k_cache.shape[3]:
        raise ConfigError(
            "q",
            f"{tuple(q.shape)} does not fit a cache of {k_cache.shape[2]} KV heads of dim "
            f"{k_cache.shape[3]}: Hq must be a multiple of Hkv and D must match",
        )
