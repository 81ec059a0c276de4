"""The typed records a run directory holds: one per request, one per engine step.

These are the public record formats of DESIGN.md ("Run directory"): the engine and the
replay produce them, the run writer appends them as JSON lines, and metrics and reports read
them back through `from_json`. Fields keep their documented names; strategy-specific step
counters (KV blocks, prefix hits, speculative counts, roofline figures) travel in
`counters` and are written as top-level keys beside the fixed ones. Readers tolerate what a
crash or an older run left out: a missing optional field reads as its default.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from functools import cache
from typing import Any

FINISH_REASONS = ("stop", "length", "rejected", "error", "cancelled", "stopped")
SUCCESS = ("stop", "length")


@dataclass
class RequestRecord:
    """One `requests.jsonl` line: a request from arrival to delivery (times in run seconds)."""

    id: str
    prompt_len: int
    output_len: int
    t_scheduled: float  # when the request arrived; every latency starts here
    token_times: list[float]
    output_ids: list[int]
    finish_reason: str | None  # stop | length | rejected | error | cancelled | stopped (the run)
    t_send: float | None = None  # when the client handed it over (a diagnostic of the client)
    t_done: float | None = None  # when the complete response was delivered
    error: str | None = None
    preemptions: int = 0
    preempt_times: list[float] = field(default_factory=list)
    t_admitted: float | None = None  # first step that computed any of its tokens
    cached_prompt_tokens: int = 0  # prompt tokens found in the prefix cache of others' blocks
    excluded: bool = False  # warm-up or cool-down: recorded, left out of metrics
    counters: dict[str, Any] = field(default_factory=dict)  # strategy-specific
    sample_index: int = 0  # n > 1: which sample of its request (ids `ID`, `ID#1`, `ID#2`...)

    @property
    def succeeded(self) -> bool:
        return self.finish_reason in SUCCESS and bool(self.token_times)

    @property
    def delivered_at(self) -> float:
        """`t_done`; records written before it existed (schema 1) delivered at the last token."""
        return self.t_done if self.t_done is not None else self.token_times[-1]

    def to_json(self) -> dict[str, Any]:
        return _to_json(self)

    @classmethod
    def from_json(cls, payload: dict[str, Any]) -> RequestRecord:
        return _from_json(cls, payload)


@dataclass
class StepRecord:
    """One `steps.jsonl` line: what one engine step ran and what the KV cache held."""

    step: int
    t_start: float
    t_end: float
    model_s: float  # the model forward(s) alone
    num_seqs: int  # sequences in the batch, padding rows included
    prefill_tokens: int
    decode_tokens: int
    waiting: int
    running: int  # unfinished requests holding a place in the batch
    kv_allocated_slots: int
    kv_live_slots: int
    kv_total_slots: int
    kv_waste: float
    preempted: int
    pad_tokens: int = 0  # tokens computed only as padding (static batching), output discarded
    delivered: int = 0  # responses handed back at the end of this step
    logits_rows: int = 0  # rows the LM head scored (the tokens whose successor was due)
    attended_pairs: int = 0  # (query, key) pairs causal attention scored, all sequences
    context_tokens: int = 0  # tokens of context the batch's sequences hold after the step
    counters: dict[str, Any] = field(default_factory=dict)  # strategy-specific, roofline

    def to_json(self) -> dict[str, Any]:
        return _to_json(self)

    @classmethod
    def from_json(cls, payload: dict[str, Any]) -> StepRecord:
        return _from_json(cls, payload)


def step_kind(record: StepRecord) -> str:
    """decode (every token a decode token), prefill, or mixed."""
    return fed_kind(record.prefill_tokens, record.decode_tokens)


def fed_kind(prefill: int, decode: int) -> str:
    """decode (no prompt fed), prefill (no decode fed), or mixed, from what a step fed of
    each (tokens or rows)."""
    if prefill == 0:
        return "decode"
    return "prefill" if decode == 0 else "mixed"


@cache
def fixed_fields(cls: type) -> tuple[str, ...]:
    """A record class's field names but `counters`, in order: asked once per class (looked
    up for every record, they took about as long as parsing the record's line)."""
    return tuple(f.name for f in fields(cls) if f.name != "counters")


def _to_json(record: Any) -> dict[str, Any]:
    """A record's fields in their order, its counters merged in: the one line it writes.
    Shallow (a deep copy per step was most of a long simulated run's time; so was a getattr
    per field): the line is written at once."""
    payload = dict(vars(record))
    payload.update(payload.pop("counters"))
    return payload


@cache
def _fixed_field_set(cls: type) -> frozenset[str]:
    return frozenset(fixed_fields(cls))


def _from_json(cls: type, payload: dict[str, Any]) -> Any:
    names = _fixed_field_set(cls)
    known: dict[str, Any] = {}
    counters: dict[str, Any] = {}
    for key, value in payload.items():
        if key in names:
            known[key] = value
        else:
            counters[key] = value
    return cls(**known, counters=counters)
