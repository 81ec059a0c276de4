"""Roofline accounting: the work an engine step must do, and how close it came to the machine.

For every step we count the floating-point operations the batch requires and the minimum
bytes it must move, from the model's shape and the step's batch alone, so the figures do
not depend on how well a strategy is implemented. Divided by the step's measured time and
by this machine's measured peaks (`harness.measure.calibrate`), they give MFU (model FLOPs
utilisation) and MBU (memory bandwidth utilisation): why a strategy is faster, and how
much headroom is left.

What is counted (L layers, hidden H, q heads of size d, intermediate I, vocab V, T new
tokens in the step):

- FLOPs: every linear layer 2 * tokens * in * out (q, k, v, o projections; gate, up and
  down of the SwiGLU MLP); attention QK^T and PV together 2 * 2 * heads * d per (query,
  key) pair, each new token attending causally to its context; the LM head only for the
  `num_logits` rows whose next token is wanted. Norms, RoPE, softmax and the SwiGLU gate
  are elementwise and left out.
- Bytes: the weights once (`weight_bytes`, as the caller measures them: quantised weights
  move fewer bytes); the KV cache each sequence's attention reads (its whole context,
  K and V, every layer, in the heads the cache stores); the K and V of the new tokens
  written into the cache; activations, taking norms, RoPE, residual adds, the SwiGLU gate
  and the cache write as fused into the matrix products around them. Per layer and new
  token that is H in and q*d out for the QKV projection, q*d in and out for attention,
  q*d in and H out for the O projection, H in and I out for gate/up, I in and H out for
  down; plus the embedding writing H per token and the LM head reading H and writing V
  per logit row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from servelab.base.records import StepRecord
from servelab.engine.model_runner import attended_pairs
from servelab.models.model import ModelConfig

if TYPE_CHECKING:
    from servelab.harness.measure.calibrate import Peaks


@dataclass(frozen=True)
class ModelShape:
    """The dimensions of a Llama-family decoder that the roofline counts depend on."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_embeddings: bool

    @classmethod
    def of(cls, config: ModelConfig) -> ModelShape:
        return cls(
            num_layers=config.num_layers,
            hidden_size=config.hidden_size,
            num_heads=config.num_heads,
            num_kv_heads=config.num_kv_heads,
            head_dim=config.head_dim,
            intermediate_size=config.intermediate_size,
            vocab_size=config.vocab_size,
            tie_embeddings=config.tie_embeddings,
        )


@dataclass(frozen=True)
class StepCost:
    """The work one engine step must do."""

    flops: float  # FLOPs the step must do
    bytes: float  # minimum bytes it must move: weights once, KV read and written, activations


def step_cost(
    shape: ModelShape,
    weight_bytes: float,
    query_lens: Sequence[int],
    seq_lens: Sequence[int],
    num_logits: int,
    kv_bytes_per_element: float,
    act_bytes_per_element: float,
    stored_kv_heads: int | None = None,
) -> StepCost:
    """FLOPs and minimum bytes of one step (see the module docstring for what is counted).

    `weight_bytes` is what one forward reads of the weights: every layer, the final norm and
    the LM head (an untied input embedding table is only gathered at a few rows; leave it
    out). `query_lens[b]` new tokens of sequence b whose context after the step is
    `seq_lens[b]` tokens. `stored_kv_heads` is how many heads the cache stores, which differs
    from the model's `num_kv_heads` under a head-layout strategy; it defaults to
    `num_kv_heads`.
    """
    if len(query_lens) != len(seq_lens):
        raise ValueError(
            f"query_lens has {len(query_lens)} entries but seq_lens has {len(seq_lens)}"
        )
    for b, (q, s) in enumerate(zip(query_lens, seq_lens, strict=True)):
        if q < 0 or s < q:
            raise ValueError(f"sequence {b}: need 0 <= query_len <= seq_len, got {q} and {s}")
    tokens = sum(query_lens)
    if not 0 <= num_logits <= tokens:
        raise ValueError(
            f"num_logits must be between 0 and the {tokens} new tokens, got {num_logits}"
        )
    kv_heads = shape.num_kv_heads if stored_kv_heads is None else stored_kv_heads
    pairs = sum(attended_pairs(q, s) for q, s in zip(query_lens, seq_lens, strict=True))
    return work_of_counts(
        shape, weight_bytes, tokens, pairs, sum(seq_lens), num_logits,
        kv_bytes_per_element, act_bytes_per_element, kv_heads,
    )  # fmt: skip


def work_of_counts(
    shape: ModelShape,
    weight_bytes: float,
    tokens: int,
    pairs: int,
    context_tokens: int,
    num_logits: int,
    kv_bytes_per_element: float,
    act_bytes_per_element: float,
    kv_heads: int,
) -> StepCost:
    """`step_cost` from a step's totals: tokens fed, attended (query, key) pairs, context
    tokens after the step, LM-head rows (what a step record keeps)."""
    layers = shape.num_layers
    hidden = shape.hidden_size
    q_width = shape.num_heads * shape.head_dim
    kv_width = shape.num_kv_heads * shape.head_dim
    inter = shape.intermediate_size
    vocab = shape.vocab_size

    linear_per_token = (
        hidden * q_width + 2 * hidden * kv_width + q_width * hidden + 3 * hidden * inter
    )
    flops = (
        layers * (2 * tokens * linear_per_token + 4 * q_width * pairs)
        + 2 * num_logits * hidden * vocab
    )

    kv_token_bytes = layers * 2 * kv_heads * shape.head_dim * kv_bytes_per_element
    kv_bytes = kv_token_bytes * (context_tokens + tokens)
    act_per_token = 4 * hidden + 4 * q_width + 2 * inter
    act_elements = tokens * hidden + layers * tokens * act_per_token + num_logits * (hidden + vocab)
    moved = weight_bytes + kv_bytes + act_elements * act_bytes_per_element
    return StepCost(flops=float(flops), bytes=float(moved))


def utilisation(cost: StepCost, seconds: float, peaks: Peaks) -> tuple[float, float]:
    """(MFU, MBU): achieved FLOP/s and byte/s over the measured peaks of this machine."""
    if not seconds > 0:
        raise ValueError(f"seconds must be positive, got {seconds}")
    mfu = cost.flops / seconds / peaks.matmul_flops_per_s
    mbu = cost.bytes / seconds / peaks.copy_bytes_per_s
    return mfu, mbu


@dataclass(frozen=True)
class StepRoofline:
    """Everything fixed for a run, so the engine can annotate each step record cheaply."""

    shape: ModelShape
    weight_bytes: float
    kv_bytes_per_element: float
    act_bytes_per_element: float
    stored_kv_heads: int
    peaks: Peaks | None

    def annotate(self, record: StepRecord) -> None:
        """Add `flops`, `bytes` and, with peaks, `mfu` and `mbu` (over `model_s`) to a
        record's counters, from the counts the record already holds."""
        cost = work_of_counts(
            self.shape, self.weight_bytes,
            record.prefill_tokens + record.decode_tokens + record.pad_tokens,
            record.attended_pairs, record.context_tokens, record.logits_rows,
            self.kv_bytes_per_element, self.act_bytes_per_element, self.stored_kv_heads,
        )  # fmt: skip
        counters = record.counters
        counters["flops"] = cost.flops
        counters["bytes"] = cost.bytes
        if self.peaks is not None and record.model_s > 0:
            counters["mfu"], counters["mbu"] = utilisation(cost, record.model_s, self.peaks)


def run_utilisation(
    steps: Sequence[StepRecord], peaks: dict | None
) -> tuple[float | None, float | None]:
    """Run-level MFU and MBU: total FLOPs and bytes over total model time, over the peaks."""
    costed = [s for s in steps if "flops" in s.counters]
    model_s = sum(s.model_s for s in costed)
    if not peaks or model_s <= 0:
        return None, None
    flops = sum(s.counters["flops"] for s in costed)
    moved = sum(s.counters["bytes"] for s in costed)
    mfu = flops / model_s / peaks["matmul_flops_per_s"]
    return mfu, moved / model_s / peaks["copy_bytes_per_s"]
