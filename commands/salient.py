"""`servelab salient`: AWQ's salient-weight experiment on the configured model, in one table.

The AWQ paper motivates activation-aware quantisation by keeping about 1% of each linear's
input channels at full precision inside round-to-nearest int4 weights: chosen by activation
magnitude, that share removes most of the error; chosen by weight magnitude or at random, it
does not. This verb measures the claim on the configured model. It loads the dense model in
float32 (quality is judged in float32), collects each linear's mean input magnitude per
channel on the calibration text as AWQ's calibration does, and scores six variants on the
same windows of the evaluation text: dense, plain round-to-nearest, round-to-nearest with the
channels kept by activation, by weight and at random (`strategies.weights.salient`), and the
project's `int4-awq` checkpoint (made once and cached, as `servelab quantize` makes it). The
calibration and evaluation sections of the built-in prose share no paragraph
(`workloads.text`); the record checks it. The table is printed and the record is written as
JSON: the rows, the fraction, the seed, the group size, the model, the dtype and the texts.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.table import Table
from tqdm import tqdm

from servelab.base.errors import ConfigError
from servelab.harness.measure.perplexity import perplexity
from servelab.harness.measure.rundir import write_json_atomic
from servelab.harness.run.build import ServedModel, calibration_text, load_for_strategy
from servelab.harness.run.compose import compose, serving_weights
from servelab.harness.run.settings import (
    EngineSettings,
    dtype_name,
    engine_settings,
    model_of,
)
from servelab.kernels.attention import Attention, AttentionConfig
from servelab.kernels.linear import pack_ahead
from servelab.models.load import build_model, tokenizer_for
from servelab.models.model import LlamaModel
from servelab.models.spec import ModelSpec
from servelab.models.weights_format import CalibrationText, WeightsContext
from servelab.strategies.registry import read_config
from servelab.strategies.settings import StrategySettings, strategy_settings
from servelab.strategies.weights.calibration import calibration_windows
from servelab.strategies.weights.salient import (
    SELECTIONS,
    LinearWeights,
    Magnitudes,
    activation_magnitudes,
    chooser,
    linear_weights,
    no_channels,
    serve_keeping,
)
from servelab.workloads.text import section_chunks, text_section

SCHEMA = 1
SUMMARY = "AWQ's salient-weight experiment: int4 RTN keeping 1% of channels, chosen three ways"
USAGE = """usage: servelab salient [fraction=0.01] [seed=0] [windows=16] [out=FILE] [OVERRIDE ...]

Quantises every linear of the decoder to int4 by round to nearest (strategy.group_size,
zero points) except `fraction` of each linear's input channels, kept in full precision and
chosen by the mean activation magnitude on the calibration text (strategy.calibration_samples
x calibration_seq_len tokens, as AWQ calibrates), by the weights' L2 norm per input channel,
or at random (seeded). Scores these, dense, plain RTN and the int4-awq checkpoint in fp32 on
the same N windows of 512 tokens of the evaluation text (disjoint from the calibration
text), prints the table and writes it as JSON to FILE (default runs/salient/MODEL.json)."""
KINDS = ("dense", "awq", "rtn")  # measured in this order: AWQ is made from the dense weights
# before the RTN rows overwrite them
HOW = {"activation": "by activation magnitude", "weight": "by weight norm", "random": "at random"}


@dataclass(frozen=True)
class SalientArgs:
    """The verb's own arguments (the rest are Hydra overrides)."""

    fraction: float = field(default=0.01, metadata={"help": "share of input channels kept"})
    seed: int = field(default=0, metadata={"minimum": 0, "help": "the random choice's seed"})
    windows: int = field(default=16, metadata={"minimum": 1, "help": "evaluation windows"})
    out: str | None = field(default=None, metadata={"help": "where the JSON record goes"})

    def check(self) -> None:
        if not 0 < self.fraction <= 1:
            raise ConfigError("salient.fraction", f"{self.fraction} must be above 0, at most 1")


@dataclass(frozen=True)
class Variant:
    """One row: `kind` says how its weights are made; an `rtn` row keeps the channels that
    `selection` picks (none when it is None)."""

    name: str
    label: str
    kind: str  # dense | rtn | awq
    selection: str | None = None


@dataclass
class Row:
    variant: str
    label: str
    channels_kept: int  # input channels at full precision, over every decoder linear
    channels_total: int
    perplexity: float
    tokens: int  # tokens scored
    seconds: float  # to score them


@dataclass(frozen=True)
class Evaluation:
    """The held-out windows every row is scored on."""

    token_ids: list[int]
    attention: Attention
    windows: int

    def row(self, variant: Variant, model: LlamaModel, kept: int, total: int) -> Row:
        start = time.perf_counter()
        value, tokens = perplexity(model, self.token_ids, self.attention, max_windows=self.windows)
        seconds = time.perf_counter() - start
        return Row(variant.name, variant.label, kept, total, value, tokens, seconds)


@dataclass(frozen=True)
class Setup:
    """The configured model and the strategies the rows are served under (in float32)."""

    cfg: DictConfig  # serving int4-awq, whose keys (group size, calibration) every row reads
    model: ModelSpec
    settings: EngineSettings
    dense: StrategySettings
    awq: StrategySettings

    @property
    def cache_dir(self) -> Path:
        return self.model.cache_dir


def variants(fraction: float) -> tuple[Variant, ...]:
    """The six rows, in table order."""
    share = f"{fraction * 100:g}%"
    kept = (
        Variant(
            f"rtn-keep-{selection}", f"int4 RTN, {share} kept {HOW[selection]}", "rtn", selection
        )
        for selection in SELECTIONS
    )
    return (
        Variant("dense", "dense (no quantisation)", "dense"),
        Variant("rtn", "int4 RTN, none kept", "rtn"),
        *kept,
        Variant("awq", "int4-awq checkpoint", "awq"),
    )


def main(args: list[str]) -> None:
    salient, rest = parse_args(args)
    cfg = compose(rest)
    path = Path(salient.out or f"runs/salient/{cfg.model.name}.json")
    record = salient_main(cfg, salient, path)
    Console().print(table(record))
    print(f"record: {path}")


def parse_args(args: list[str]) -> tuple[SalientArgs, list[str]]:
    """Split the verb's own `name=value` arguments from the Hydra overrides, and check them."""
    names = {f.name for f in fields(SalientArgs)}
    own = [a for a in args if a.partition("=")[0] in names]
    rest = [a for a in args if a.partition("=")[0] not in names]
    return read_config(SalientArgs, OmegaConf.from_dotlist(own), "salient"), rest


def setup(cfg: DictConfig) -> Setup:
    dense_cfg, awq_cfg = serving_weights(cfg, "dense"), serving_weights(cfg, "int4-awq")
    return Setup(
        awq_cfg,
        model_of(awq_cfg),
        engine_settings(awq_cfg.engine),
        strategy_settings(dense_cfg.strategy),
        strategy_settings(awq_cfg.strategy),
    )


def salient_main(
    cfg: DictConfig, args: SalientArgs, path: Path, progress: bool = True
) -> dict[str, Any]:
    """Measure every variant under `cfg`, write the record to `path` and return it."""
    start = time.perf_counter()
    run = setup(cfg)
    dense = load_for_strategy(run.model, run.settings, run.dense, progress)
    calibration = calibration_text(run.model)
    awq = run.awq.weights.config
    windows = calibration_windows(
        calibration.token_ids(), awq.calibration_samples, awq.calibration_seq_len
    )
    experiment = Experiment(
        run,
        dense,
        held_out(run, dense, args.windows),
        calibration,
        activation_magnitudes(dense.model, windows, progress),
        args,
        progress,
    )
    rows, awq_made = experiment.rows()
    record = experiment.record(rows, int(windows.numel())) | {
        "awq_checkpoint": awq_made.get("folder"),
        "seconds": time.perf_counter() - start,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, record)
    return record


def held_out(run: Setup, dense: ServedModel, windows: int) -> Evaluation:
    """The first `windows` windows of the evaluation text, in the model's tokens."""
    tokenizer = dense.loaded.tokenizer or tokenizer_for(run.model)
    return Evaluation(
        tokenizer.encode(text_section("evaluation")),
        Attention(AttentionConfig(impl=run.settings.attention), run.settings.device),
        windows,
    )


@dataclass
class Experiment:
    """The dense model, the texts and the activation statistics the rows are made from."""

    run: Setup
    dense: ServedModel
    evaluation: Evaluation
    calibration: CalibrationText
    magnitudes: Magnitudes
    args: SalientArgs
    progress: bool

    def rows(self) -> tuple[list[Row], dict[str, Any]]:
        """Every variant's row, in table order, and how the AWQ checkpoint was made. The
        dense model is scored first, then serves each RTN variant in turn (its linears
        overwritten)."""
        snapshot = linear_weights(self.dense.model)
        total = sum(int(weight.shape[1]) for weight in snapshot.values())
        table_order = variants(self.args.fraction)
        bar = tqdm(total=len(table_order), desc="salient: perplexity", disable=not self.progress)
        scored: dict[str, Row] = {}
        awq_made: dict[str, Any] = {}
        for variant in sorted(table_order, key=lambda v: KINDS.index(v.kind)):
            bar.set_postfix_str(variant.name)
            if variant.kind == "dense":
                model, kept = self.dense.model, total
            elif variant.kind == "awq":
                model, awq_made = self.awq_model()
                kept = 0
            else:
                model, kept = self.dense.model, self.serve_rtn(variant, snapshot)
            scored[variant.name] = self.evaluation.row(variant, model, kept, total)
            bar.update()
        bar.close()
        return [scored[variant.name] for variant in table_order], awq_made

    def serve_rtn(self, variant: Variant, snapshot: LinearWeights) -> int:
        """Serve `variant` on the dense model's linears; the input channels it keeps."""
        args = self.args
        choose = (
            no_channels
            if variant.selection is None
            else chooser(variant.selection, args.fraction, args.seed, self.magnitudes)
        )
        group_size = self.run.awq.weights.config.group_size
        return serve_keeping(self.dense.model, snapshot, choose, group_size)[0]

    def awq_model(self) -> tuple[LlamaModel, dict[str, Any]]:
        """The int4-awq model of the dense checkpoint (cached under the same name as a run's),
        as served: its layers, head layout and packing; and how its checkpoint was made."""
        run, dense = self.run, self.dense
        weights = run.awq.weights.build()
        context = WeightsContext(
            run.settings.dtype,
            run.settings.device,
            run.cache_dir,
            dense.checkpoint_id,
            self.progress,
            self.calibration,
        )
        checkpoint = weights.prepare((dense.loaded.config, dense.model.state_dict()), context)
        model = build_model(checkpoint, run.settings.dtype, run.settings.device, weights.linear)
        run.awq.heads.build().apply(model)
        pack_ahead(model)
        return model, weights.record() or {}

    def record(self, rows: list[Row], calibration_tokens: int) -> dict[str, Any]:
        """What was measured and under which settings, for the JSON record."""
        run, args, awq = self.run, self.args, self.run.awq.weights.config
        return {
            "schema": SCHEMA,
            "model": str(run.cfg.model.name),
            "checkpoint_id": self.dense.checkpoint_id,
            "dtype": dtype_name(run.settings.dtype),
            "device": str(run.settings.device),
            "fraction": args.fraction,
            "seed": args.seed,
            "group_size": awq.group_size,
            "evaluation": {
                "section": "evaluation",
                "windows": args.windows,
                "tokens": rows[0].tokens,
            },
            "calibration": {
                "section": "calibration",
                "text": self.calibration.name,
                "text_sha256": self.calibration.digest,
                "samples": awq.calibration_samples,
                "seq_len": awq.calibration_seq_len,
                "tokens": calibration_tokens,
            },
            "texts_disjoint": texts_disjoint(),
            "rows": [row_record(row, rows[0]) for row in rows],
        }


def row_record(row: Row, dense: Row) -> dict[str, Any]:
    return asdict(row) | {"ratio_to_dense": row.perplexity / dense.perplexity}


def texts_disjoint() -> bool:
    """Whether the calibration and evaluation sections share no chunk of text."""
    return not set(section_chunks("calibration")) & set(section_chunks("evaluation"))


def table(record: dict[str, Any]) -> Table:
    """The record as a table: variant, channels kept, perplexity, ratio to dense."""
    evaluation, calibration = record["evaluation"], record["calibration"]
    disjoint = "disjoint" if record["texts_disjoint"] else "NOT disjoint"
    result = Table(
        title=(
            f"Salient channels kept in int4 RTN: {record['model']}, {record['dtype']}, "
            f"group {record['group_size']}, fraction {record['fraction']:g}, seed {record['seed']}"
        ),
        caption=(
            f"perplexity on {evaluation['tokens']:,} tokens ({evaluation['windows']} windows) of "
            f"the evaluation text; activations from {calibration['tokens']:,} tokens of the "
            f"calibration text ({disjoint})"
        ),
    )
    for column in ("variant", "channels kept", "perplexity", "ratio to dense"):
        result.add_column(column, justify="left" if column == "variant" else "right")
    for row in record["rows"]:
        share = row["channels_kept"] / row["channels_total"]
        result.add_row(
            row["label"],
            f"{row['channels_kept']:,} of {row['channels_total']:,} ({share:.2%})",
            f"{row['perplexity']:.3f}",
            f"{row['ratio_to_dense']:.3f}",
        )
    return result
