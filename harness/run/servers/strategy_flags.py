"""A strategy preset as another engine's own switches (`server=vllm server.strategy=orca`): the
seed strategies measured as vLLM, SGLang and llama.cpp implement them.

Each axis of the preset (`conf/strategy/`) becomes the engine's switch where it has one: vLLM's
`--enable-chunked-prefill`, `--enable-prefix-caching`, `--max-num-seqs`, `--quantization awq`,
`--speculative-config`; SGLang's `--chunked-prefill-size`, `--disable-radix-cache`,
`--max-running-requests`, `--quantization awq`;
llama.cpp's `--parallel`, `--cont-batching`, `--cache-reuse`. The batch limits come from the
run's `engine.max_batch_size` and `engine.max_num_batched_tokens`, as they bound servelab's own
engine. A choice the engine has no switch for is refused with one line naming the engine and
the axis; where the engine's fixed design differs from the preset without a switch to say so
(vLLM's KV is always paged), the translation says so in a note the run records. A paged
preset's block size is left to the engine, whose attention backend decides what it takes
(vLLM on a CPU refuses 16, the presets' block, and starts only with multiples of 32).

    python -m servelab.harness.run.servers.strategy_flags   # the table docs/strategies.md shows
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from servelab.base.errors import ConfigError

ENGINES = ("vllm", "sglang", "llamacpp")


@dataclass(frozen=True)
class Translated:
    flags: tuple[str, ...]  # the engine's switches for the preset, before `server.flags`
    notes: tuple[str, ...]  # what the engine does its own way, with no switch for the preset's


class NoSwitch(ConfigError):
    """The engine has no switch for one of the preset's choices."""

    def __init__(self, engine: str, preset: str, reason: str) -> None:
        super().__init__("server.strategy", f"{engine} cannot serve {preset}: {reason}")
        self.reason = reason


def translate(
    engine: str, preset: str, strategy: Mapping[str, Any], limits: Mapping[str, Any]
) -> Translated:
    """`strategy` (a composed preset node) as `engine`'s switches, under the run's batch
    `limits` (`engine.max_batch_size`, `engine.max_num_batched_tokens`)."""

    def refuse(message: str) -> NoSwitch:
        return NoSwitch(engine, preset, message)

    s = strategy
    if s["heads"] != "gqa":
        raise refuse(
            f"it serves the checkpoint's own attention heads (strategy.heads={s['heads']})"
        )
    if s["policy"] != "fcfs":
        raise refuse(f"it admits requests in arrival order (strategy.policy={s['policy']})")
    if s["weights"] == "int4-rtn":
        raise refuse("it has no round-to-nearest int4 switch (strategy.weights=int4-rtn)")
    if s["decoding"] == "speculative" and s["gamma_rule"] != "fixed":
        raise refuse("it drafts a fixed number of tokens (strategy.gamma_rule=adaptive)")
    paged = s["kv"] == "paged"
    prefix = paged and bool(s["prefix_caching"])
    return TRANSLATORS[engine](s, paged, prefix, limits, refuse)


Refuse = Callable[[str], NoSwitch]


def _vllm(s: Mapping, paged: bool, prefix: bool, limits: Mapping, refuse: Refuse) -> Translated:
    if s["batching"] == "static":
        raise refuse("it re-plans its batch every step; it has no static batching")
    if paged and s["preemption"] != "recompute":
        raise refuse("it preempts by recomputing; it has no swap switch (strategy.preemption)")
    if s["decoding"] == "speculative" and s["proposer"] != "ngram":
        raise refuse(
            f"its switch here is prompt lookup; the {s['proposer']} proposer's draft is its "
            "own --speculative-config, in server.flags"
        )
    flags = ["--max-num-seqs", f"{limits['max_batch_size']}"]
    if s["chunked_prefill"]:
        flags += [
            "--enable-chunked-prefill",
            "--max-num-batched-tokens",
            f"{limits['max_num_batched_tokens']}",
        ]
    else:
        flags.append("--no-enable-chunked-prefill")
    flags.append("--enable-prefix-caching" if prefix else "--no-enable-prefix-caching")
    notes = [
        "its KV block size is its own unless server.same_budget sizes its KV (vLLM on a CPU "
        "takes multiples of 32 only)"
        if paged
        else "its KV is paged whatever the preset: no contiguous reservation"
    ]
    if s["weights"] == "int4-awq":
        flags += ["--quantization", "awq"]
        notes.append("server.model must be an AWQ checkpoint")
    if s["decoding"] == "speculative":
        config = {
            "method": "ngram",
            "num_speculative_tokens": s["gamma"],
            "prompt_lookup_min": s["ngram_min"],
            "prompt_lookup_max": s["ngram_max"],
        }
        flags += ["--speculative-config", json.dumps(config, separators=(",", ":"))]
    return Translated(tuple(flags), tuple(notes))


def _sglang(s: Mapping, paged: bool, prefix: bool, limits: Mapping, refuse: Refuse) -> Translated:
    if s["batching"] == "static":
        raise refuse("it re-plans its batch every step; it has no static batching")
    if paged and s["preemption"] != "recompute":
        raise refuse("it retracts requests to recompute them; it has no swap switch")
    if s["decoding"] == "speculative":
        raise refuse(
            f"its speculative switches take a draft model (in server.flags), not this preset's "
            f"{s['proposer']} proposer"
        )
    chunk = limits["max_num_batched_tokens"] if s["chunked_prefill"] else -1
    flags = [
        "--max-running-requests",
        f"{limits['max_batch_size']}",
        "--chunked-prefill-size",
        f"{chunk}",
    ]
    notes = [
        "its KV page size is its own"
        if paged
        else "its KV is a token pool whatever the preset: no contiguous reservation"
    ]
    if not prefix:
        flags.append("--disable-radix-cache")
    if s["weights"] == "int4-awq":
        flags += ["--quantization", "awq"]
        notes.append("server.model must be an AWQ checkpoint")
    return Translated(tuple(flags), tuple(notes))


def _llamacpp(s: Mapping, paged: bool, prefix: bool, limits: Mapping, refuse: Refuse) -> Translated:
    if s["batching"] == "iteration" and s["chunked_prefill"]:
        raise refuse("it has no chunked-prefill switch (it feeds prompts in --batch-size pieces)")
    if s["weights"] == "int4-awq":
        raise refuse("it serves the GGUF file's own quantization, not AWQ int4")
    if s["decoding"] == "speculative":
        raise refuse(
            f"its speculative switch takes a draft model (-md, in server.flags), not this "
            f"preset's {s['proposer']} proposer"
        )
    continuous = s["batching"] == "iteration"
    flags = [
        "--parallel",
        f"{limits['max_batch_size']}",
        "--cont-batching" if continuous else "--no-cont-batching",
    ]
    notes = (
        [
            "each slot holds its own contiguous KV, -c split across --parallel slots, unless "
            "server.same_budget makes it one pool (--kv-unified)"
        ]
        if paged
        else []
    )
    if prefix:
        flags += ["--cache-reuse", f"{s['block_size']}"]
    return Translated(tuple(flags), tuple(notes))


TRANSLATORS = {"vllm": _vllm, "sglang": _sglang, "llamacpp": _llamacpp}


def table(presets: Mapping[str, Mapping[str, Any]], limits: Mapping[str, Any]) -> str:
    """Every preset on every engine, as docs/strategies.md shows it (markdown)."""
    lines = ["| preset | " + " | ".join(ENGINES) + " |", "|---" * (len(ENGINES) + 1) + "|"]
    for name, node in presets.items():
        cells = []
        for engine in ENGINES:
            try:
                done = translate(engine, name, node, limits)
            except NoSwitch as refused:
                cells.append("no: " + refused.reason)
                continue
            cell = f"`{' '.join(done.flags)}`"
            cells.append(cell + "".join(f" ({note})" for note in done.notes))
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    from servelab.harness.run.compose import compose, strategy_presets

    engine = compose([]).engine
    print(table(strategy_presets(), engine))
