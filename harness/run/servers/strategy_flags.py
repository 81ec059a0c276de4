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

from servelab.base.errors import ConfigError
from servelab.harness.run.settings import EngineSettings
from servelab.strategies.batching.iteration import IterationConfig
from servelab.strategies.decoding.proposers import NgramConfig
from servelab.strategies.decoding.speculative import SpeculativeConfig
from servelab.strategies.kv.paged import PagedConfig
from servelab.strategies.settings import StrategySettings

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


def translate(engine: str, strategy: StrategySettings, limits: EngineSettings) -> Translated:
    """`strategy` (a preset, checked) as `engine`'s switches, under the run's batch limits
    (`engine.max_batch_size`, `engine.max_num_batched_tokens`)."""

    def refuse(message: str) -> NoSwitch:
        return NoSwitch(engine, strategy.name, message)

    s = strategy
    if s.heads.value != "gqa":
        raise refuse(
            f"it serves the checkpoint's own attention heads (strategy.heads={s.heads.value})"
        )
    if s.policy.value != "fcfs":
        raise refuse(f"it admits requests in arrival order (strategy.policy={s.policy.value})")
    if s.weights.value == "int4-rtn":
        raise refuse("it has no round-to-nearest int4 switch (strategy.weights=int4-rtn)")
    served = Served.of(s, limits)
    if served.speculative is not None and served.speculative.gamma_rule != "fixed":
        raise refuse("it drafts a fixed number of tokens (strategy.gamma_rule=adaptive)")
    return TRANSLATORS[engine](served, refuse)


@dataclass(frozen=True)
class Served:
    """What of a strategy and the run's limits the engines' switches say."""

    strategy: StrategySettings
    paged: PagedConfig | None  # None: contiguous KV
    prefix: bool  # paged, and reusing a cached prompt prefix
    chunked: bool  # iteration-level batching that splits long prompts
    speculative: SpeculativeConfig | None
    max_batch_size: int
    max_num_batched_tokens: int

    @classmethod
    def of(cls, s: StrategySettings, limits: EngineSettings) -> Served:
        kv, batching, decoding = s.kv.config, s.batching.config, s.decoding.config
        paged = kv if isinstance(kv, PagedConfig) else None
        return cls(
            strategy=s,
            paged=paged,
            prefix=paged is not None and paged.prefix_caching,
            chunked=isinstance(batching, IterationConfig) and batching.chunked_prefill,
            speculative=decoding if isinstance(decoding, SpeculativeConfig) else None,
            max_batch_size=limits.max_batch_size,
            max_num_batched_tokens=limits.max_num_batched_tokens,
        )

    @property
    def static(self) -> bool:
        return self.strategy.batching.value == "static"

    @property
    def swaps(self) -> bool:
        return self.paged is not None and self.paged.preemption != "recompute"

    @property
    def awq(self) -> bool:
        return self.strategy.weights.value == "int4-awq"


Refuse = Callable[[str], NoSwitch]


def _vllm(s: Served, refuse: Refuse) -> Translated:
    if s.static:
        raise refuse("it re-plans its batch every step; it has no static batching")
    if s.swaps:
        raise refuse("it preempts by recomputing; it has no swap switch (strategy.preemption)")
    proposer = s.strategy.proposer
    if s.speculative is not None and not isinstance(proposer.config, NgramConfig):
        raise refuse(
            f"its switch here is prompt lookup; the {proposer.value} proposer's draft is its "
            "own --speculative-config, in server.flags"
        )
    flags = ["--max-num-seqs", f"{s.max_batch_size}"]
    if s.chunked:
        flags += [
            "--enable-chunked-prefill",
            "--max-num-batched-tokens",
            f"{s.max_num_batched_tokens}",
        ]
    else:
        flags.append("--no-enable-chunked-prefill")
    flags.append("--enable-prefix-caching" if s.prefix else "--no-enable-prefix-caching")
    notes = [
        "its KV block size is its own unless server.same_budget sizes its KV (vLLM on a CPU "
        "takes multiples of 32 only)"
        if s.paged is not None
        else "its KV is paged whatever the preset: no contiguous reservation"
    ]
    if s.awq:
        flags += ["--quantization", "awq"]
        notes.append("server.model must be an AWQ checkpoint")
    if s.speculative is not None and isinstance(proposer.config, NgramConfig):
        config = {
            "method": "ngram",
            "num_speculative_tokens": s.speculative.gamma,
            "prompt_lookup_min": proposer.config.ngram_min,
            "prompt_lookup_max": proposer.config.ngram_max,
        }
        flags += ["--speculative-config", json.dumps(config, separators=(",", ":"))]
    return Translated(tuple(flags), tuple(notes))


def _sglang(s: Served, refuse: Refuse) -> Translated:
    if s.static:
        raise refuse("it re-plans its batch every step; it has no static batching")
    if s.swaps:
        raise refuse("it retracts requests to recompute them; it has no swap switch")
    if s.speculative is not None:
        raise refuse(
            f"its speculative switches take a draft model (in server.flags), not this preset's "
            f"{s.strategy.proposer.value} proposer"
        )
    chunk = s.max_num_batched_tokens if s.chunked else -1
    flags = ["--max-running-requests", f"{s.max_batch_size}", "--chunked-prefill-size", f"{chunk}"]
    notes = [
        "its KV page size is its own"
        if s.paged is not None
        else "its KV is a token pool whatever the preset: no contiguous reservation"
    ]
    if not s.prefix:
        flags.append("--disable-radix-cache")
    if s.awq:
        flags += ["--quantization", "awq"]
        notes.append("server.model must be an AWQ checkpoint")
    return Translated(tuple(flags), tuple(notes))


def _llamacpp(s: Served, refuse: Refuse) -> Translated:
    if s.chunked:
        raise refuse("it has no chunked-prefill switch (it feeds prompts in --batch-size pieces)")
    if s.awq:
        raise refuse("it serves the GGUF file's own quantization, not AWQ int4")
    if s.speculative is not None:
        raise refuse(
            f"its speculative switch takes a draft model (-md, in server.flags), not this "
            f"preset's {s.strategy.proposer.value} proposer"
        )
    flags = [
        "--parallel",
        f"{s.max_batch_size}",
        "--no-cont-batching" if s.static else "--cont-batching",
    ]
    notes = (
        [
            "each slot holds its own contiguous KV, -c split across --parallel slots, unless "
            "server.same_budget makes it one pool (--kv-unified)"
        ]
        if s.paged is not None
        else []
    )
    if s.prefix and s.paged is not None:
        flags += ["--cache-reuse", f"{s.paged.block_size}"]
    return Translated(tuple(flags), tuple(notes))


TRANSLATORS = {"vllm": _vllm, "sglang": _sglang, "llamacpp": _llamacpp}


def table(presets: Mapping[str, StrategySettings], limits: EngineSettings) -> str:
    """Every preset on every engine, as docs/strategies.md shows it (markdown)."""
    lines = ["| preset | " + " | ".join(ENGINES) + " |", "|---" * (len(ENGINES) + 1) + "|"]
    for name, strategy in presets.items():
        cells = []
        for engine in ENGINES:
            try:
                done = translate(engine, strategy, limits)
            except NoSwitch as refused:
                cells.append("no: " + refused.reason)
                continue
            cell = f"`{' '.join(done.flags)}`"
            cells.append(cell + "".join(f" ({note})" for note in done.notes))
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    from servelab.harness.run.compose import compose, strategy_presets
    from servelab.harness.run.settings import engine_settings
    from servelab.strategies.settings import strategy_settings

    presets = {name: strategy_settings(node) for name, node in strategy_presets().items()}
    print(table(presets, engine_settings(compose([]).engine)))
