"""The `workload` config node, read into checked dataclasses before anything is generated.

Every value is checked here, and every combination that cannot work (a file source
without its file, time windows on an offline workload, trace times without a trace), so
that a bad config stops with one line naming the field before any work starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from servelab.base.errors import ConfigError
from servelab.workloads.arrivals import ArrivalSpec, parse_arrival_spec
from servelab.workloads.cache_bust import resolved
from servelab.workloads.fields import Node
from servelab.workloads.lengths import LengthSpec, parse_length_spec
from servelab.workloads.prompts import GENERATED, PromptSpec, parse_prompt_spec
from servelab.workloads.traces import TraceSpec, parse_trace_spec
from servelab.workloads.windows import WindowSpec, parse_window_spec

ROOT = "workload"
WORKLOAD_KEYS = (
    "name",
    "seed",
    "num_requests",
    "ignore_eos",
    "sampling",
    "input_len",
    "output_len",
    "length_scale",
    "cache_bust",
    "prompt",
    "arrival",
    "warmup",
    "cooldown",
    "trace",
    "path",
)
SAMPLING_KEYS = ("temperature", "top_k", "top_p", "n")


@dataclass(frozen=True)
class SamplingSpec:
    """Sampling settings shared by every request of the workload."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    n: int = 1  # samples per request (parallel sampling)


@dataclass(frozen=True)
class WorkloadConfig:
    """The whole workload node, checked."""

    name: str
    seed: int
    num_requests: int | None  # generated sources only; file sources take their rows
    ignore_eos: bool
    sampling: SamplingSpec
    input_len: LengthSpec | None  # None: lengths come from a file
    output_len: LengthSpec | None  # None: every request's length comes from a file
    length_scale: float
    prompt: PromptSpec
    arrival: ArrivalSpec
    warmup: WindowSpec
    cooldown: WindowSpec
    trace: TraceSpec
    path: Path | None  # jsonl prompt file
    cache_bust: int | None = None  # a nonce: every prompt's head drawn from it (`cache_bust`)


def parse_workload_config(value: object) -> WorkloadConfig:
    """Check the `workload` node and everything it combines."""
    node = Node.of(value, ROOT, WORKLOAD_KEYS)
    prompt = parse_prompt_spec(node.raw("prompt"), node.field("prompt"))
    arrival = parse_arrival_spec(node.raw("arrival"), node.field("arrival"))
    trace = parse_trace_spec(node.raw("trace"), node.field("trace"))
    generated = prompt.source in GENERATED
    config = WorkloadConfig(
        name=node.optional_text("name") or "workload",
        seed=node.integer("seed", default=0, minimum=0),
        num_requests=_num_requests(node, generated),
        ignore_eos=node.flag("ignore_eos", default=False),
        sampling=_sampling(node.child("sampling", SAMPLING_KEYS)),
        input_len=_length(node, "input_len", required=generated),
        output_len=_length(node, "output_len", required=generated),
        length_scale=node.positive("length_scale", default=1.0),
        prompt=prompt,
        arrival=arrival,
        warmup=parse_window_spec(node.raw("warmup"), node.field("warmup")),
        cooldown=parse_window_spec(node.raw("cooldown"), node.field("cooldown")),
        trace=trace,
        path=_prompt_file(node, prompt.source),
        cache_bust=resolved(node.raw("cache_bust")),
    )
    _check_combination(config)
    return config


def _num_requests(node: Node, generated: bool) -> int | None:
    count = node.optional_integer("num_requests", minimum=1)
    if generated and count is None:
        raise ConfigError(node.field("num_requests"), "is required: the number of requests")
    if not generated and count is not None:
        raise ConfigError(
            node.field("num_requests"),
            "must be null for jsonl and trace sources (they send their rows); "
            "truncate with workload.trace.max_requests",
        )
    return count


def _sampling(node: Node) -> SamplingSpec:
    top_p = node.number("top_p", default=1.0)
    if not 0.0 < top_p <= 1.0:
        raise ConfigError(node.field("top_p"), f"is {top_p}; it must be in (0, 1]")
    return SamplingSpec(
        temperature=node.number("temperature", default=0.0, minimum=0.0),
        top_k=node.integer("top_k", default=0, minimum=0),
        top_p=top_p,
        n=node.integer("n", default=1, minimum=1),
    )


def _length(node: Node, key: str, required: bool) -> LengthSpec | None:
    if node.raw(key) is None:
        if required:
            raise ConfigError(node.field(key), "is required: give a length distribution")
        return None
    return parse_length_spec(node.raw(key), node.field(key))


def _prompt_file(node: Node, source: str) -> Path | None:
    text = node.optional_text("path")
    if source != "jsonl":
        if text is not None:
            raise ConfigError(
                node.field("path"), "only the jsonl source reads a prompt file; use workload=jsonl"
            )
        return None
    if text is None:
        raise ConfigError(node.field("path"), "the jsonl workload needs workload.path=FILE")
    return Path(text).expanduser()


def _check_combination(config: WorkloadConfig) -> None:
    source = config.prompt.source
    if source == "trace" and config.trace.path is None:
        raise ConfigError(f"{ROOT}.trace.path", "the trace source needs workload.trace.path=FILE")
    if source != "trace" and config.trace.path is not None:
        raise ConfigError(
            f"{ROOT}.trace.path", "only the trace source reads a trace file; use workload=trace"
        )
    if config.arrival.process == "trace" and source not in ("trace", "jsonl"):
        raise ConfigError(
            f"{ROOT}.arrival.process",
            "trace arrivals need a file: set workload.prompt.source to trace or jsonl",
        )
    if config.arrival.process in ("offline", "closed_loop"):
        for key, window in (("warmup", config.warmup), ("cooldown", config.cooldown)):
            if window.seconds:
                raise ConfigError(
                    f"{ROOT}.{key}.seconds",
                    f"{config.arrival.process} requests have no schedule; use {key}.requests",
                )
